"""SVG pieces of the HTML report: a time scale with its ticks, colours, and a finding's slice drawn as
bars per process.

Everything is inline SVG text with every string from the history escaped, so the report needs no
script, font or image from anywhere else.
"""

from __future__ import annotations

import html
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

#: Fill colours of operation outcomes (``info``: the outcome is unknown).
OUTCOME_COLOURS: Final = {"ok": "#6db6fe", "fail": "#f7a8cf", "info": "#ffaa26"}
CITED_FILL: Final = "#d32f2f"
NICE_STEPS: Final = (1, 2, 5)


def esc(value: object) -> str:
    """``value`` as SVG/HTML text (quotes too, for attributes)."""
    return html.escape(str(value), quote=True)


def colour_for(name: str) -> str:
    """A light colour that always stands for ``name`` (a leader, a holder)."""
    hue = zlib.crc32(name.encode()) % 24 * 15
    return f"hsl({hue},60%,72%)"


@dataclass(frozen=True, slots=True)
class Scale:
    """Time (ns from ``t0`` to ``t1``) to x pixels from ``left`` over ``width``."""

    t0: int
    t1: int
    left: float
    width: float

    def x(self, time_ns: float) -> float:
        return self.left + (time_ns - self.t0) * self.width / max(self.t1 - self.t0, 1)

    def ticks(self, most: int = 12) -> list[tuple[float, str]]:
        """Round times from ``t0`` (at most ``most``) with their labels, in seconds or milliseconds."""
        span = max(self.t1 - self.t0, 1)
        step = nice_step(span / most)
        unit, divisor = ("s", 1e9) if step >= 100_000_000 else ("ms", 1e6)
        count = int(span // step)
        return [(self.x(self.t0 + i * step), f"{i * step / divisor:g} {unit}") for i in range(count + 1)]


def nice_step(at_least: float) -> int:
    """The smallest 1, 2 or 5 times a power of ten (in ns) not below ``at_least``."""
    power = 1
    while True:
        for step in NICE_STEPS:
            if step * power >= at_least:
                return step * power
        power *= 10


def rect(x: float, y: float, w: float, h: float, fill: str, *, extra: str = "", title: str = "") -> str:
    """A rectangle, at least half a pixel wide, with more attributes (``extra``) and a tooltip."""
    body = f"<title>{esc(title)}</title></rect>" if title else "</rect>"
    size = f"width='{max(w, 0.5):.1f}' height='{h:.1f}'"
    return f"<rect x='{x:.1f}' y='{y:.1f}' {size} fill='{fill}'{extra}>{body}"


def text(x: float, y: float, value: object, extra: str = "") -> str:
    """A text label (baseline at ``y``)."""
    return f"<text x='{x:.1f}' y='{y:.1f}'{extra}>{esc(value)}</text>"


def svg(width: float, height: float, body: Iterable[str], css_class: str) -> str:
    """An ``<svg>`` element of that size."""
    return (
        f"<svg class='{css_class}' xmlns='http://www.w3.org/2000/svg' width='{width:.0f}' "
        f"height='{height:.0f}' viewBox='0 0 {width:.0f} {height:.0f}'>{''.join(body)}</svg>"
    )


SLICE_WIDTH: Final = 900
SLICE_LEFT: Final = 90
SLICE_ROW: Final = 34


def slice_svg(items: list[dict[str, Any]], links: list[str | None]) -> str:
    """A finding's slice: its items as bars (points for events and reads) on one row per process,
    marked ones in red; each item drawn with a link in ``links`` leads to it on the run's timeline."""
    ends = [item["end"] for item in items if item["end"] is not None] + [item["start"] for item in items]
    t0, last = min(item["start"] for item in items), max(ends)
    horizon = last + max((last - t0) // 10, 1)
    scale = Scale(t0, horizon, SLICE_LEFT, SLICE_WIDTH - SLICE_LEFT - 20)
    processes = sorted({item["process"] for item in items})
    row_of = {process: index for index, process in enumerate(processes)}
    body = [
        text(SLICE_LEFT - 8, 20 + i * SLICE_ROW + 4, f"process {p}", " class='lbl' text-anchor='end'")
        for p, i in row_of.items()
    ]
    placed = dict.fromkeys(processes, 0)
    for item, link in zip(items, links, strict=True):
        y = 20 + row_of[item["process"]] * SLICE_ROW
        start = scale.x(item["start"])
        colour = CITED_FILL if item["mark"] else "#4a78a8"
        if item["end"] is None:
            open_end = " stroke-dasharray='4 2' opacity='.6'"
            shape = rect(start, y - 3, scale.x(horizon) - start, 6, colour, extra=open_end)
        elif item["end"] == item["start"] and item.get("op_id") is None:
            shape = f"<circle cx='{start:.1f}' cy='{y}' r='4' fill='{colour}'/>"
        else:
            shape = rect(start, y - 4, scale.x(item["end"]) - start, 8, colour)
        if link is not None:
            shape = f"<a href='#{esc(link)}'><title>{esc(item['label'])}: on the timeline</title>{shape}</a>"
        above = placed[item["process"]] % 2 == 0  # alternate labels above and below a row
        placed[item["process"]] += 1
        body += [
            shape,
            text(start, y - 7 if above else y + 15, item["label"], f" fill='{colour}' class='small'"),
        ]
    height = 20 + len(processes) * SLICE_ROW + 10
    for x, label in scale.ticks(8):
        body.append(f"<line x1='{x:.1f}' x2='{x:.1f}' y1='6' y2='{height - 14}' class='grid'/>")
        body.append(text(x, height - 2, label, " class='small' text-anchor='middle'"))
    return svg(SLICE_WIDTH, height + 4, body, "slice")
