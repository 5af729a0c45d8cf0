"""Tables of a benchmark report (rich on a terminal, Markdown for docs) and the targets' summary."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rich.console import Console
from rich.table import Table

COLUMNS = (
    ("workload", "workload"),
    ("ours p50 ms", "ours_p50_ms"),
    ("ours p99 ms", "ours_p99_ms"),
    ("baseline", "baseline"),
    ("base p50 ms", "baseline_p50_ms"),
    ("base p99 ms", "baseline_p99_ms"),
    ("ratio", "ratio"),
    ("target", "target"),
    ("holds", "holds"),
)
THROUGHPUT = (
    ("ops/s ours 1t", "ours_ops_1t"),
    ("ops/s raw 1t", "baseline_ops_1t"),
    ("ops/s ours 8t", "ours_ops_8t"),
    ("ops/s raw 8t", "baseline_ops_8t"),
)
AT_REST = (
    ("CPU % of a core", "cpu_pct"),
    ("RSS MiB", "rss_mb"),
    ("seconds", "seconds"),
    ("target", "target"),
    ("holds", "holds"),
)
SCALE = (
    ("sessions", "sessions"),
    ("MiB/session idle", "rss_per_session_mb"),
    ("MiB/session loaded", "rss_loaded_per_session_mb"),
    ("KiB/member", "rss_per_member_kb"),
    ("KiB/watched key", "rss_per_key_kb"),
    ("joined ms", "joined_ms"),
    ("update ms", "update_ms"),
)


def cell(value: Any, key: str = "") -> str:
    """One table cell: numbers compact (ratios with two decimals), booleans as yes/NO, missing as a dash."""
    if key == "ratio" and isinstance(value, float):
        return f"{value:.2f}"
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"
    return str(value)


def _sections(report: dict[str, Any]) -> list[tuple[str, tuple[tuple[str, str], ...], list[dict[str, Any]]]]:
    rows = report["results"]
    ops = [row for row in rows if row["workload"].startswith("op.")]
    scale = [row for row in rows if row["workload"].startswith("scale.")]
    idle = [row for row in rows if row["workload"].startswith("idle.")]
    return [
        ("at rest", (COLUMNS[0], *AT_REST), idle),
        ("latency and targets", COLUMNS, [row for row in rows if row not in idle]),
        ("throughput", (COLUMNS[0], *THROUGHPUT), ops),
        ("scale", (COLUMNS[0], ("converge ms", "ours_p50_ms"), *SCALE), scale),
    ]


def print_report(report: dict[str, Any], console: Console) -> None:
    """The report as rich tables, then the targets that do not hold and the failed workloads."""
    title = f"consensus bench: {report['backend']}" + (" (--quick)" if report.get("quick") else "")
    for name, columns, rows in _sections(report):
        if not rows:
            continue
        table = Table(title=f"{title}: {name}", title_justify="left")
        for header, _ in columns:
            table.add_column(header, overflow="fold")
        for row in rows:
            style = "red" if row.get("holds") is False else None
            table.add_row(*(cell(row.get(key), key) for _, key in columns), style=style)
        console.print(table)
    if report.get("scale_note") and any(row["workload"].startswith("scale.") for row in report["results"]):
        console.print(report["scale_note"])
    for line in summary(report["results"]):
        console.print(line, highlight=False)


def summary(rows: Iterable[dict[str, Any]]) -> list[str]:
    """``targets: N of M hold`` and one line per target that does not hold or workload that failed."""
    rows = list(rows)
    judged = [row for row in rows if row.get("holds") is not None]
    lines = [f"targets: {sum(1 for row in judged if row['holds'])} of {len(judged)} hold"]
    for row in judged:
        if not row["holds"]:
            ratio = cell(row.get("ratio"), "ratio")
            lines.append(f"  does not hold: {row['workload']}: {row['target']} (ratio {ratio})")
    for row in rows:
        if row.get("note", "") and str(row["note"]).startswith("failed"):
            lines.append(f"  {row['workload']} {row['note']}")
    return lines


def markdown(report: dict[str, Any]) -> str:
    """The report's tables in Markdown (for docs/performance.md)."""
    out = []
    for name, columns, rows in _sections(report):
        if not rows:
            continue
        out.append(f"**{report['backend']}: {name}**\n")
        out.append("| " + " | ".join(header for header, _ in columns) + " |")
        out.append("|" + "---|" * len(columns))
        for row in rows:
            out.append("| " + " | ".join(cell(row.get(key), key) for _, key in columns) + " |")
        out.append("")
    return "\n".join(out)


def failed(report: dict[str, Any]) -> list[str]:
    """Workloads that produced no numbers."""
    return [
        row["workload"]
        for row in report["results"]
        if row.get("ours_p50_ms") is None and row.get("cpu_pct") is None
    ]
