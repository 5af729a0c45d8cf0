"""The HTML report of a check of Jepsen histories, drawn the way porcupine's visualization is.

One self-contained file without scripts: a table of every file's verdict,
then per violation the key's operations on a time line (one row per
process, a bar from invoke to completion, open to the right when the outcome
is unknown) as inline SVG; a label too long for its bar shows on hover. Bars
in the longest linearizable prefix found are green and numbered in their
linearization order, the operation that could not follow it is red and
labelled, the rest grey; the minimal failing window follows as a table.
All text from the histories is HTML-escaped.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

from consensus_chaos.check.external import FileVerdict, exit_code
from consensus_chaos.check.report import escape, html_table

MAX_VIOLATIONS: Final = 20
_STYLE: Final = (
    "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;margin:1em 0}"
    "td,th{border:1px solid #ccc;padding:.2em .5em;text-align:left}th{background:#f3f3f3}"
    ".ok{color:#1a7f37}.violation,.invalid{color:#c62828;font-weight:bold}.unknown{color:#b26a00}"
    "svg text{font-size:10px;font-family:monospace}"
)
_ROW: Final = 26
_LEFT: Final = 80
_SCALE: Final = 14  # pixels per line of the history
_CHAR: Final = 6  # pixels per character of a label


def timeline_svg(items: list[dict[str, Any]]) -> str:
    """The operations ``items`` (``start``/``end`` in lines, ``prefix`` position or None, ``mark``) as SVG."""
    origin = min(i["start"] for i in items)
    horizon = max([i["end"] for i in items if i["end"] is not None] + [i["start"] for i in items]) + 2
    processes = sorted({i["process"] for i in items})
    row_of = {p: n for n, p in enumerate(processes)}
    width, height = _LEFT + (horizon - origin) * _SCALE + 20, (len(processes) + 1) * _ROW
    parts = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}'>"]
    for process, row in row_of.items():
        parts.append(f"<text x='4' y='{row * _ROW + 17}'>process {escape(process)}</text>")
    for item in sorted(items, key=lambda i: i["start"]):
        x = _LEFT + (item["start"] - origin) * _SCALE
        end = horizon if item["end"] is None else item["end"]
        w, y = max(_SCALE // 2, (end - item["start"]) * _SCALE), row_of[item["process"]] * _ROW + 4
        color = "#e57373" if item["mark"] else "#81c784" if item.get("prefix") is not None else "#cfd8dc"
        dash = " stroke-dasharray='4 3'" if item["end"] is None else ""
        order = "" if item.get("prefix") is None else f"{item['prefix'] + 1}: "
        title = f"{order}{item['label']} (lines {item['start']}-{item['end'] or 'never'})"
        text = order + item["label"]
        if (
            not item["mark"] and len(text) * _CHAR > w
        ):  # too long for its bar: the number only, the rest on hover
            text = order.rstrip(": ") if len(order) * _CHAR <= w + _CHAR else ""
        parts.append(
            f"<g><title>{escape(title)}</title><rect x='{x}' y='{y}' width='{w}' height='{_ROW - 8}' "
            f"fill='{color}' stroke='#555'{dash}/><text x='{x + 2}' y='{y + 12}'>{escape(text)}</text></g>"
        )
    parts.append("</svg>")
    return "".join(parts)


def _violation(verdict: FileVerdict) -> str:
    found = verdict.violation
    key = found["key"] or "(the register)"
    parts = [
        f"<h2>{escape(Path(verdict.path).name)}: key <code>{escape(key)}</code></h2>",
        f"<p>{escape(found.get('message', ''))}</p>",
    ]
    if found.get("timeline"):
        parts.append(
            f"<p>All {len(found['timeline'])} operations of the key; times are line numbers. Green: the "
            f"longest linearizable prefix found ({found['prefix']} operations, numbered in order); red: the "
            "operation that cannot follow it; dashed: outcome unknown.</p>"
        )
        parts.append(f"<div style='overflow-x:auto'>{timeline_svg(found['timeline'])}</div>")
    window = found.get("window", [])
    if window:
        parts.append("<h3>Minimal failing window</h3>")
        rows = [
            [
                i["process"],
                i["start"],
                "never" if i["end"] is None else i["end"],
                ("▶ " if i["mark"] else "") + i["label"],
            ]
            for i in window
        ]
        parts.append(html_table(["process", "invoke line", "completion line", "operation"], rows))
    return "\n".join(parts)


def render(verdicts: list[FileVerdict], engine: str) -> str:
    """The report as an HTML document."""
    code = exit_code(verdicts)
    overall = {0: "ok", 1: "violation", 2: "invalid", 3: "unknown"}[code]
    rows = [
        [
            Path(v.path).name,
            v.verdict,
            v.operations,
            v.keys,
            f"{v.seconds:.3f}",
            v.error or v.violation.get("key", ""),
        ]
        for v in verdicts
    ]
    body = [
        f"<h1>consensus check: <span class='{overall}'>{overall}</span></h1>",
        f"<p>engine {escape(engine)}; {len(verdicts)} histories; exit code {code}</p>",
        html_table(["file", "verdict", "operations", "keys", "seconds", "error / key"], rows),
        *(_violation(v) for v in [v for v in verdicts if v.violation][:MAX_VIOLATIONS]),
    ]
    head = f"<meta charset='utf-8'><title>consensus check</title><style>{_STYLE}</style>"
    return f"<!doctype html><html><head>{head}</head><body>{''.join(body)}</body></html>"


def write_report(verdicts: list[FileVerdict], engine: str, path: Path) -> None:
    """Write the HTML report to ``path``."""
    path.write_text(render(verdicts, engine), encoding="utf-8")
