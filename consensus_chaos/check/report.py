"""The HTML report of a check: verdicts, each finding's slice with a timeline plot, latencies, handovers.

The report is one self-contained file: plots are PNGs embedded as base64
(matplotlib, drawn without pyplot so no display is needed). All text from
the history is HTML-escaped.
"""

from __future__ import annotations

import base64
import html
import io
import statistics
from pathlib import Path
from typing import Any

from consensus_api.errors import ConfigurationError
from consensus_chaos.check.result import Outcome

MAX_FINDINGS = 20
_STYLE = (
    "body{font-family:sans-serif;margin:2em;max-width:70em}table{border-collapse:collapse;margin:1em 0}"
    "td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left}th{background:#f3f3f3}"
    ".ok{color:#1a7f37}.violation,.invalid{color:#c62828;font-weight:bold}.unknown{color:#b26a00}"
    "code{font-size:90%}"
)


def escape(value: object) -> str:
    """``value`` as HTML text."""
    return html.escape(str(value))


def html_table(header: list[str], rows: list[list[object]]) -> str:
    """A table with ``header`` and ``rows``, every cell escaped."""
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def timeline_png(items: list[dict[str, Any]], title: str) -> str:
    """``items`` as a base64 PNG: operations as bars, events and reads as dots, marked items in red."""
    try:
        from matplotlib.figure import Figure  # noqa: PLC0415 - an optional dependency
    except ImportError:
        raise ConfigurationError("the report needs matplotlib: pip install matplotlib") from None
    origin = min(item["start"] for item in items)
    finite = [item["end"] for item in items if item["end"] is not None] + [item["start"] for item in items]
    horizon = (max(finite) - origin) / 1e6 or 1.0
    processes = sorted({item["process"] for item in items})
    row_of = {process: index for index, process in enumerate(processes)}
    figure = Figure(figsize=(10, 1.4 + 0.7 * len(processes)))
    axes = figure.subplots()
    labels_on_row = dict.fromkeys(processes, 0)
    for item in sorted(items, key=lambda i: i["start"]):
        y, start = row_of[item["process"]], (item["start"] - origin) / 1e6
        color = "#c62828" if item["mark"] else "#4a78a8"
        if item["end"] is None:
            axes.plot([start, horizon * 1.1], [y, y], color=color, linestyle="--", linewidth=3)
        elif item["end"] == item["start"] and item.get("op_id") is None:
            axes.plot([start], [y], "o", color=color)
        else:
            axes.plot(
                [start, (item["end"] - origin) / 1e6], [y, y], color=color, linewidth=6, solid_capstyle="butt"
            )
        above = labels_on_row[item["process"]] % 2 == 0  # alternate above and below the bar
        labels_on_row[item["process"]] += 1
        offset = (0, 6) if above else (0, -13)
        axes.annotate(
            item["label"], (start, y), xytext=offset, textcoords="offset points", fontsize=7, color=color
        )
    axes.set_yticks(range(len(processes)), [f"process {p}" for p in processes])
    axes.set_ylim(-0.7, len(processes) - 0.3)
    axes.set_xlabel("ms")
    axes.set_title(title, fontsize=9)
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90)
    return base64.b64encode(buffer.getvalue()).decode()


def _finding(finding: dict[str, Any]) -> str:
    detail = finding["detail"]
    items = detail.get("timeline", [])
    parts = [
        f"<h3><span class='{escape(finding['verdict'])}'>{escape(finding['verdict'])}</span>: "
        f"{escape(finding['check'])} of <code>{escape(finding['key'])}</code></h3>",
        f"<p>{escape(detail.get('message', ''))}</p>",
    ]
    if items:
        origin = min(item["start"] for item in items)
        rows = [
            [
                i["process"],
                f"{(i['start'] - origin) / 1e6:.3f}",
                "never" if i["end"] is None else f"{(i['end'] - origin) / 1e6:.3f}",
                ("▶ " if i["mark"] else "") + i["label"],
            ]
            for i in items
        ]
        parts.append(html_table(["process", "start ms", "end ms", "operation / event"], rows))
        png = timeline_png(items, f"{finding['check']}: {finding['key']}")
        parts.append(f"<img alt='timeline' src='data:image/png;base64,{png}'>")
    return "\n".join(parts)


def render(outcome: Outcome) -> str:
    """The report as an HTML document."""
    summary = outcome.to_json()
    checks = [
        [name, c["verdict"], c["objects"], c["ops"], c.get("violation", 0), c.get("unknown", 0)]
        for name, c in summary["checks"].items()
    ]
    latency = [
        [f, int(r["count"]), f"{r['p50']:.2f}", f"{r['p90']:.2f}", f"{r['p99']:.2f}", f"{r['max']:.2f}"]
        for f, r in summary["latency_ms"].items()
    ]
    handovers = [
        [s, len(g), f"{statistics.median(g):.3f}", f"{max(g):.3f}"] for s, g in summary["handover_s"].items()
    ]
    verdict = (
        "ok" if outcome.exit_code == 0 else {1: "violation", 2: "invalid", 3: "unknown"}[outcome.exit_code]
    )
    body = [
        f"<h1>consensus check: <span class='{verdict}'>{verdict}</span></h1>",
        f"<p>engine {escape(outcome.engine)}, {outcome.seconds:.1f} s; exit code {outcome.exit_code}</p>",
        html_table(["run", "backend"], [[run, backend] for run, backend in sorted(outcome.runs.items())]),
        "<h2>Checks</h2>",
        html_table(["check", "verdict", "objects", "ops", "violations", "unknown"], checks),
        "<h2>Faults</h2>",
        html_table(["fault", "count"], [[f, n] for f, n in sorted(outcome.faults.items())])
        if outcome.faults
        else "<p>none recorded</p>",
        f"<h2>Findings ({len(outcome.findings)})</h2>",
        *(_finding(f) for f in outcome.findings[:MAX_FINDINGS]),
        "<h2>Latency per operation (ms, completed operations)</h2>",
        html_table(["operation", "count", "p50", "p90", "p99", "max"], latency),
        "<h2>Leader handovers</h2><p>Seconds from the first sign a leader was gone to the first sighting "
        "of the next one.</p>",
        html_table(["service", "handovers", "median", "max"], handovers)
        if handovers
        else "<p>none observed</p>",
    ]
    head = f"<meta charset='utf-8'><title>consensus check</title><style>{_STYLE}</style>"
    return f"<!doctype html><html><head>{head}</head><body>{''.join(body)}</body></html>"


def write_report(outcome: Outcome, path: Path) -> None:
    """Write the HTML report to ``path``."""
    path.write_text(render(outcome), encoding="utf-8")
