"""The timeline of one run, as one inline SVG: a lane per client process with every operation from
invoke to completion coloured by outcome, the nemesis' fault windows shaded across the whole drawing
with their names, latency over time, and strips of the leader of each service, the holders of each
lock and the owners of each resource over time.

Every item a finding cites is drawn on its process' lane on top of the rest (red if the finding marks
it as failing, dark grey if it is context; at least 3 pixels wide, with a marker above it), with the
element id the findings link to.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

from consensus_chaos.check.report_history import Lane, RunView, Span
from consensus_chaos.check.report_svg import (
    CITED_FILL,
    OUTCOME_COLOURS,
    Scale,
    colour_for,
    esc,
    rect,
    svg,
    text,
)

WIDTH: Final = 1240
LEFT: Final = 150
RIGHT: Final = 16
#: Pixel columns of the time axis: the resolution ``report_history`` thins to.
COLUMNS: Final = WIDTH - LEFT - RIGHT
FAULT_ROWS: Final = 3
#: About the width of a character of a 9 px label.
LABEL_CHAR: Final = 4.6
ROW: Final = 13
LANE: Final = 13
LATENCY_HEIGHT: Final = 110
STRIP: Final = 13
STRIP_TITLES: Final = {"leader": "leader of", "lock": "holders of", "owner": "owners of"}
#: The fill of the items a finding cites for context (the ones it marks are ``CITED_FILL``).
CONTEXT_FILL: Final = "#37474f"
_SLOT = re.compile(r"client (\d+)")


@dataclass(frozen=True, slots=True)
class Citation:
    """An item a finding cites, drawn with element id ``anchor`` on the lane of ``process``."""

    anchor: str
    process: int
    start: int
    end: int | None
    label: str
    point: bool
    marked: bool


def run_svg(view: RunView, citations: Iterable[Citation]) -> str:
    """The run's timeline (see the module docstring)."""
    scale = Scale(view.t0, view.t1, LEFT, COLUMNS)
    cited = list(citations)
    known = {lane.process for lane in view.lanes}
    missing = sorted({item.process for item in cited} - known)  # not in the history: drawn all the same
    lanes = view.lanes + [Lane(process, -1, view.t0, view.t0) for process in missing]
    lanes_top = FAULT_ROWS * ROW + 16
    lane_of = {lane.process: index for index, lane in enumerate(lanes)}
    lanes_bottom = lanes_top + len(lanes) * LANE
    latency_top = lanes_bottom + 22
    strips_top = latency_top + LATENCY_HEIGHT + 18
    strips, strips_bottom = _strips(view, scale, strips_top)
    height = strips_bottom + 20
    body = [_axis(scale, lanes_top, height - 18)]  # panels have see-through backgrounds: faults first
    body += _faults(view, lanes, scale, (lanes_top, height - 18))
    body += _lanes(view, lanes, scale, lanes_top)
    body += _latency(view, scale, latency_top)
    body += strips
    body += _citations(cited, scale, lanes_top, lane_of)
    return svg(WIDTH, height, body, "timeline")


def _axis(scale: Scale, top: float, bottom: float) -> str:
    parts = []
    for x, label in scale.ticks():
        parts.append(f"<line x1='{x:.1f}' x2='{x:.1f}' y1='{top - 4}' y2='{bottom}' class='grid'/>")
        parts.append(text(x, top - 6, label, " class='small' text-anchor='middle'"))
        parts.append(text(x, bottom + 12, label, " class='small' text-anchor='middle'"))
    return "".join(parts)


def _lanes(view: RunView, lanes: list[Lane], scale: Scale, top: float) -> list[str]:
    bars: dict[int, list[str]] = {lane.process: [] for lane in lanes}
    for bar in view.bars:
        x = scale.x(bar.start)
        fill = OUTCOME_COLOURS.get(bar.outcome, "#999")
        bars[bar.process].append(rect(x, 2, scale.x(bar.end) - x, LANE - 4, fill, title=bar.title))
    parts = []
    for index, lane in enumerate(lanes):
        y = top + index * LANE
        label = text(
            LEFT - 6, LANE - 3, f"client {lane.client} · p{lane.process}", " class='lbl' text-anchor='end'"
        )
        background = rect(LEFT, 0, COLUMNS, LANE, "#000", extra=f" opacity='{0.04 if index % 2 else 0}'")
        parts.append(
            f"<g class='lane' data-process='{lane.process}' data-client='{lane.client}' "
            f"transform='translate(0 {y})'>{background}{label}{''.join(bars[lane.process])}</g>"
        )
    return parts


def _latency(view: RunView, scale: Scale, top: float) -> list[str]:
    """Latency (log scale) over time at invoke; one dot per pixel column, latency bin and outcome."""
    if not view.latencies:
        return []
    low = math.floor(math.log10(max(min(lat for _, lat, _ in view.latencies), 1) / 1e6))
    high = max(math.ceil(math.log10(max(lat for _, lat, _ in view.latencies) / 1e6)), low + 1)

    def y(latency_ns: float) -> float:
        decades = math.log10(max(latency_ns, 1) / 1e6) - low
        return top + LATENCY_HEIGHT - decades * LATENCY_HEIGHT / (high - low)

    parts = [rect(LEFT, top, COLUMNS, LATENCY_HEIGHT, "none", extra=" stroke='#ddd'")]
    parts.append(text(LEFT + 4, top + 11, "latency (from invoke to completion, log scale)", " class='lbl'"))
    for decade in range(low, high + 1):
        at = top + LATENCY_HEIGHT - (decade - low) * LATENCY_HEIGHT / (high - low)
        parts.append(f"<line x1='{LEFT}' x2='{LEFT + COLUMNS}' y1='{at:.1f}' y2='{at:.1f}' class='grid'/>")
        parts.append(text(LEFT - 6, at + 3, _duration(10.0**decade), " class='small' text-anchor='end'"))
    paths: dict[str, list[str]] = {}
    for column, latency, outcome in view.latencies:
        paths.setdefault(outcome, []).append(f"M{LEFT + column:.0f} {y(latency) - 1:.1f}h2v2h-2z")
    for outcome, moves in sorted(paths.items()):
        fill = OUTCOME_COLOURS.get(outcome, "#999")
        edge = f"stroke='{_darker(outcome)}' stroke-width='.4'"
        parts.append(f"<path class='latency {esc(outcome)}' fill='{fill}' {edge} d='{''.join(moves)}'/>")
    return parts


def _duration(ms: float) -> str:
    return f"{ms / 1000:g} s" if ms >= 1000 else f"{ms:g} ms"


def _darker(outcome: str) -> str:
    return {"ok": "#2f6fb0", "fail": "#c2185b", "info": "#b26a00"}.get(outcome, "#555")


def _strips(view: RunView, scale: Scale, top: float) -> tuple[list[str], float]:
    """Leader, lock holder and owner strips; returns the parts and the bottom."""
    parts: list[str] = []
    y = top
    for topic, rows in view.strips.items():
        for name, spans in rows.items():
            packed = _pack(spans)
            height = STRIP * max(len(packed), 1)
            label = f"{STRIP_TITLES[topic]} {_short(name, view.run)}"
            items = [rect(LEFT, 0, COLUMNS, height, "none", extra=" stroke='#e3e3e3'")]
            items.append(text(LEFT - 6, STRIP - 3, label, " class='lbl' text-anchor='end'"))
            for level, row in enumerate(packed):
                for span in row:
                    items.append(_span(span, scale, level * STRIP, view.t1))
            parts.append(
                f"<g class='strip {topic}' data-name='{esc(name)}' transform='translate(0 {y:.1f})'>"
                f"<title>{esc(label)}</title>{''.join(items)}</g>"
            )
            y += height + 3
    return parts, y


def _span(span: Span, scale: Scale, y: float, end_of_run: int) -> str:
    x = scale.x(span.start)
    width = scale.x(span.end if span.end is not None else end_of_run) - x
    if not span.holder:
        return rect(x, y + 2, width, STRIP - 4, "#e0e0e0", extra=" class='nobody'", title=span.title)
    edge = " stroke='#fff' stroke-width='.5'"
    shape = rect(x, y + 1, width, STRIP - 2, colour_for(span.holder), extra=edge, title=span.title)
    if width >= 6 * len(span.label) + 4:
        shape += text(x + 2, y + STRIP - 3, span.label, " class='small' pointer-events='none'")
    return shape


def _pack(spans: list[Span]) -> list[list[Span]]:
    """Spans on as few rows as overlaps allow (shared leases overlap)."""
    rows: list[list[Span]] = []
    ends: list[float] = []
    for span in sorted(spans, key=lambda s: s.start):
        end = math.inf if span.end is None else span.end
        free = next((i for i, last in enumerate(ends) if last <= span.start), None)
        if free is None:
            rows.append([span])
            ends.append(end)
        else:
            rows[free].append(span)
            ends[free] = end
    return rows


def _short(name: str, run: str) -> str:
    """A key without the run's own prefix (``chaos/<run>/``)."""
    head, found, tail = name.partition(f"/{run}/")
    return tail if found and "/" not in head else name


def _faults(view: RunView, lanes: list[Lane], scale: Scale, top_bottom: tuple[float, float]) -> list[str]:
    """Each fault window shaded from the lanes' top to the bottom, darker on the lanes of its target
    client, named above the lanes (on the first of the rows there with room for the name)."""
    top, bottom = top_bottom
    parts = []
    slots: dict[int, list[int]] = {}
    for index, lane in enumerate(lanes):
        slots.setdefault(lane.client, []).append(index)
    label_ends = [-math.inf] * FAULT_ROWS  # names go on the first row with room for them
    for fault in view.faults:
        x = scale.x(fault.start)
        width = scale.x(fault.end if fault.end is not None else view.t1) - x
        seconds = ((fault.end or view.t1) - fault.start) / 1e9
        title = f"{fault.name} {fault.target}: {fault.detail} ({seconds:.2f} s)"
        items = [
            rect(x, top, width, bottom - top, "#7e57c2", extra=" class='shade' opacity='.13'", title=title)
        ]
        match = _SLOT.match(fault.target)
        for row in slots.get(int(match.group(1)), []) if match else []:
            items.append(rect(x, top + row * LANE, width, LANE, "#7e57c2", extra=" opacity='.22'"))
        label = f"{fault.name} {fault.target}"
        row = next((r for r, end in enumerate(label_ends) if end < x), label_ends.index(min(label_ends)))
        label_ends[row] = x + LABEL_CHAR * len(label) + 6
        label_y = ROW * row + ROW - 3
        items.append(f"<line x1='{x:.1f}' x2='{x:.1f}' y1='{label_y - 9}' y2='{top}' stroke='#7e57c2'/>")
        items.append(text(x + 2, label_y, label, " class='small fault-name'"))
        parts.append(f"<g class='fault' data-fault='{esc(fault.name)}'>{''.join(items)}</g>")
    return parts


def _citations(cited: list[Citation], scale: Scale, top: float, lane_of: dict[int, int]) -> list[str]:
    parts = []
    for item in cited:
        y = top + lane_of[item.process] * LANE
        x = scale.x(item.start)
        fill = CITED_FILL if item.marked else CONTEXT_FILL
        marker = f"<path d='M{x - 4:.1f} {y - 4:.1f}h8l-4 5z' fill='{fill}'/>"
        if item.point:
            diamond = f"M{x:.1f} {y:.1f}l5 {LANE / 2}l-5 {LANE / 2}l-5 -{LANE / 2}z"
            shape = (
                f"<path id='{esc(item.anchor)}' class='cited' fill='{fill}' d='{diamond}'>"
                f"<title>{esc(item.label)}</title></path>"
            )
        else:
            end = scale.x(item.end) if item.end is not None else scale.x(scale.t1)
            width = max(end - x, 3.0)
            dash = "" if item.end is not None else " stroke-dasharray='3 2'"
            ident = f" id='{esc(item.anchor)}' class='cited'{dash}"
            shape = rect(x, y + 1, width, LANE - 2, fill, extra=ident, title=item.label)
        parts.append(marker + shape)
    return [f"<g class='citations'>{''.join(parts)}</g>"]
