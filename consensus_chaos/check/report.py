"""The HTML report of a check: verdicts; per run a timeline of every operation per client process with
the nemesis' fault windows shaded, latency over time, leaders, lock holders and owners over time; each
finding with its slice and links to the items it cites on the timeline; latency and handover tables.

The report is one self-contained file: inline SVG and CSS, no script, font or image from anywhere
else, so it opens offline. All text from the history is HTML-escaped. The timelines need the history
(``render(outcome, history=directory)``); without it the report has the findings and tables only.
"""

from __future__ import annotations

import html
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from consensus_chaos.check.report_history import MAX_RUN_ROWS, RunView, read_run, run_rows
from consensus_chaos.check.report_svg import CITED_FILL, OUTCOME_COLOURS, slice_svg
from consensus_chaos.check.report_timeline import COLUMNS, CONTEXT_FILL, Citation, run_svg
from consensus_chaos.check.result import Outcome

MAX_FINDINGS = 20
_STYLE = (
    "body{font-family:sans-serif;margin:2em;max-width:1300px}table{border-collapse:collapse;margin:1em 0}"
    "td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left}th{background:#f3f3f3}"
    ".ok{color:#1a7f37}.violation,.invalid{color:#c62828;font-weight:bold}.unknown{color:#b26a00}"
    "code{font-size:90%}svg text{font-family:sans-serif}.lbl{font-size:10px;fill:#333}"
    ".small{font-size:9px;fill:#555}.fault-name{fill:#5e35b1}.grid{stroke:#e6e6e6}"
    ".cited{scroll-margin:40vh 0}.cited:target{stroke:#000;stroke-width:2.5;animation:pulse .5s 6 alternate}"
    "@keyframes pulse{to{stroke:#ffd600;stroke-width:5}}.wide{overflow-x:auto}"
    ".finding{border-left:4px solid #c62828;"
    "padding-left:1em;margin:1.5em 0}.legend span{display:inline-block;margin-right:1.2em}"
    ".legend i{display:inline-block;width:1.4em;height:.8em;margin-right:.3em;vertical-align:middle}"
    "a.cite{margin-right:.8em}.cites .marked{font-weight:bold}"
)


def escape(value: object) -> str:
    """``value`` as HTML text."""
    return html.escape(str(value))


def html_table(header: list[str], rows: list[list[object]]) -> str:
    """A table with ``header`` and ``rows``, every cell escaped."""
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def anchor(run_index: int, item: dict[str, Any]) -> str:
    """The element id of a finding's item on its run's timeline: the operation's, else the item's
    process and time (events, leases)."""
    if item.get("op_id") is not None:
        return f"run{run_index}-op{item['op_id']}"
    return f"run{run_index}-p{item['process']}-t{item['start']}"


def citations(findings: Sequence[dict[str, Any]], runs: dict[str, int]) -> dict[str, dict[str, Citation]]:
    """Per run: the items ``findings`` cite, by anchor (an item cited twice is drawn once, marked if
    any finding marks it)."""
    cited: dict[str, dict[str, Citation]] = {run: {} for run in runs}
    for finding in findings:
        run = finding["run"]
        if run not in runs:
            continue
        for item in finding["detail"].get("timeline", []):
            key = anchor(runs[run], item)
            point = item["end"] == item["start"] and item.get("op_id") is None
            marked = bool(item["mark"]) or (key in cited[run] and cited[run][key].marked)
            cited[run][key] = Citation(
                key, item["process"], item["start"], item["end"], item["label"], point, marked
            )
    return cited


def _finding(number: int, finding: dict[str, Any], runs: dict[str, int], views: dict[str, RunView]) -> str:
    detail = finding["detail"]
    items = detail.get("timeline", [])
    run = finding["run"]
    view = views.get(run)
    links = [anchor(runs[run], item) if view is not None else None for item in items]
    verdict = escape(finding["verdict"])
    run_name = escape(run) if view is None else f"<a href='#run{runs[run]}'>{escape(run)}</a>"
    parts = [
        f"<div class='finding' id='finding-{number}'>",
        f"<h3>{number}. <span class='{verdict}'>{verdict}</span>: {escape(finding['check'])} of "
        f"<code>{escape(finding['key'])}</code> <small>(run {run_name})</small></h3>",
        f"<p>{escape(detail.get('message', ''))}</p>",
    ]
    if items and view is not None:
        cites = [
            f"<a class='cite{' marked' if item['mark'] else ''}' href='#{escape(link)}'>"
            f"process {escape(item['process'])}: {escape(item['label'])} "
            f"(+{(item['start'] - view.t0) / 1e9:.3f} s)</a>"
            for item, link in zip(items, links, strict=True)
        ]
        parts.append(f"<p class='cites'>On the timeline: {' '.join(cites)}</p>")
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
        parts.append(
            f"<details open><summary>The slice: {len(items)} items, ▶ marks the failing ones</summary>"
        )
        parts.append(html_table(["process", "start ms", "end ms", "operation / event"], rows))
        parts.append(f"<div class='wide'>{slice_svg(items, links)}</div></details>")
    parts.append("</div>")
    return "\n".join(parts)


def _legend() -> str:
    swatches = [
        (OUTCOME_COLOURS["ok"], "ok"),
        (OUTCOME_COLOURS["fail"], "fail"),
        (OUTCOME_COLOURS["info"], "info (outcome unknown)"),
    ]
    swatches += [("#7e57c2;opacity:.35", "fault window (darker on its client's lanes)")]
    swatches += [(CITED_FILL, "cited by a finding, failing"), (CONTEXT_FILL, "cited by a finding, context")]
    items = "".join(
        f"<span><i style='background:{colour}'></i>{escape(label)}</span>" for colour, label in swatches
    )
    return f"<p class='legend'>{items}</p>"


def _run_section(index: int, view: RunView, cited: dict[str, Citation]) -> str:
    seconds = (view.t1 - view.t0) / 1e9
    hidden = f" ({view.hidden_lanes:,} more without a lane)" if view.hidden_lanes else ""
    summary = (
        f"{escape(view.backend)}, {seconds:.1f} s, {view.operations:,} operations on {len(view.lanes)} "
        f"processes{hidden}, {len(view.faults)} faults. One pixel is {view.ns_per_column / 1e6:.1f} ms: "
        "shorter operations next to each other share a bar (hover for counts)."
    )
    return (
        f"<section id='run{index}'><h3>Run {escape(view.run)}</h3><p>{summary}</p>"
        f"<div class='wide'>{run_svg(view, cited.values())}</div></section>"
    )


def render(outcome: Outcome, history: Path | None = None) -> str:
    """The report as an HTML document; ``history`` (the checked directory) adds the timelines."""
    shown = outcome.findings[:MAX_FINDINGS]
    sizes = run_rows(history) if history is not None else {}
    too_long = {
        run: sum(files.values()) for run, files in sizes.items() if sum(files.values()) > MAX_RUN_ROWS
    }
    keep: dict[str, set[int]] = {}
    for finding in shown:
        keep.setdefault(finding["run"], set()).update(
            i["process"] for i in finding["detail"].get("timeline", [])
        )
    views = {
        run: read_run(run, files, COLUMNS, keep.get(run, set()))
        for run, files in sorted(sizes.items())
        if run not in too_long
    }
    runs = {run: index for index, run in enumerate(views)}
    cited = citations(shown, runs)
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
    more = f" (the first {MAX_FINDINGS} shown)" if len(outcome.findings) > MAX_FINDINGS else ""
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
        f"<h2>Findings ({len(outcome.findings)}){more}</h2>",
        *(_finding(number, f, runs, views) for number, f in enumerate(shown, 1)),
    ]
    if views or too_long:
        body += ["<h2>Timelines</h2>", _legend()]
        body += [_run_section(runs[run], view, cited[run]) for run, view in views.items()]
        body += [
            f"<p>Run {escape(run)}: {rows:,} rows, more than the {MAX_RUN_ROWS:,} drawn in a timeline.</p>"
            for run, rows in sorted(too_long.items())
        ]
    body += [
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


def write_report(outcome: Outcome, path: Path, history: Path | None = None) -> None:
    """Write the HTML report to ``path``; with ``history`` (the checked directory) its timelines."""
    path.write_text(render(outcome, history), encoding="utf-8")
