"""Plots of benchmark reports (matplotlib, PNG): operation ratios, propagation and failover.

    python -m benchmarks.plots [RESULTS_DIR] [OUT_DIR]

reads the ``<backend>.json`` reports (default ``benchmarks/results``) and writes
``perf-ops.png``, ``perf-propagation.png`` and ``perf-failover.png`` (default ``docs/``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

BACKENDS = ("sqlite", "postgresql", "zookeeper", "etcd", "kafka")
OPS = ("fetch", "put", "update", "fenced_update", "keys")
COLORS = {"ours": "C0", "tooz": "C1", "kazoo": "C2"}


def _rows(report: dict[str, Any], prefix: str) -> dict[str, dict[str, Any]]:
    return {row["workload"]: row for row in report["results"] if row["workload"].startswith(prefix)}


def draw(reports: list[dict[str, Any]], out: Path) -> list[Path]:
    """Write the PNGs for ``reports`` into ``out``; the paths written (none without reports)."""
    if not reports:
        return []
    out.mkdir(parents=True, exist_ok=True)
    return [
        _save(_ops(reports), out / "perf-ops.png"),
        _save(_propagation(reports), out / "perf-propagation.png"),
        _save(_failover(reports), out / "perf-failover.png"),
    ]


def _ops(reports: list[dict[str, Any]]) -> Figure:
    figure = Figure(figsize=(9, 4))
    axes = figure.subplots()
    backends = [report["backend"] for report in reports]
    width = 0.8 / len(OPS)
    highest = 1.5
    for index, op in enumerate(OPS):
        values = [_rows(report, "op.").get(f"op.{op}", {}).get("ratio") or 0 for report in reports]
        highest = max(highest, *values)
        axes.bar([b + index * width for b in range(len(backends))], values, width, label=op)
    axes.set_ylim(0, highest * 1.25)
    axes.axhline(1.10, color="red", linestyle="--", linewidth=1, label="target 1.10")
    axes.set_xticks([b + 0.4 - width / 2 for b in range(len(backends))], backends)
    axes.set_ylabel("ours / raw client, p50 latency")
    axes.set_title("Operation cost relative to the raw client (lower is better)")
    axes.legend(fontsize=8, ncols=6, loc="upper center")
    return figure


def _propagation(reports: list[dict[str, Any]]) -> Figure:
    figure = Figure(figsize=(9, 4))
    axes = figure.subplots()
    backends = [report["backend"] for report in reports]
    series = [("ours p50", "ours_p50_ms"), ("ours p99", "ours_p99_ms")]
    series += [("raw watch p50", "baseline_p50_ms"), ("raw watch p99", "baseline_p99_ms")]
    for index, (label, key) in enumerate(series):
        values = [
            _rows(report, "propagation.").get("propagation.value", {}).get(key) or 0 for report in reports
        ]
        axes.bar([b + index * 0.2 for b in range(len(backends))], values, 0.2, label=label)
    axes.set_xticks([b + 0.3 for b in range(len(backends))], backends)
    axes.set_yscale("log")
    axes.set_ylabel("write → listener callback, ms (log)")
    axes.set_title("Change propagation: ours against the raw client's own watch")
    axes.legend(fontsize=8)
    return figure


def _failover(reports: list[dict[str, Any]]) -> Figure:
    figure = Figure(figsize=(10, 4))
    axes = figure.subplots()
    labels: list[str] = []
    for report in reports:
        for name, row in _rows(report, "failover.").items():
            kinds = [("ours", row["ours_p50_ms"], row["ours_p99_ms"])]
            if name.endswith(".kazoo"):
                kinds = [("kazoo", row["baseline_p50_ms"], row["baseline_p99_ms"])]
            elif row.get("baseline"):
                kinds.append(("tooz", row["baseline_p50_ms"], row["baseline_p99_ms"]))
            for kind, p50, p99 in kinds:
                if p50 is None:
                    continue
                position = len(labels)
                bound = row.get("session_timeout_s", 0) + 0.5
                axes.bar(position, p50 / 1000, 0.6, color=COLORS[kind])
                axes.plot([position], [(p99 or p50) / 1000], "k_", markersize=14)
                axes.plot([position - 0.35, position + 0.35], [bound, bound], "r--", linewidth=1)
                labels.append(f"{report['backend']}\n{name.split('.')[1]} {kind}")
    axes.set_xticks(range(len(labels)), labels, fontsize=6)
    axes.set_ylabel("SIGKILL → new leader's callback, s")
    axes.set_title("Leader failover: bar p50, black tick p99, red dashes the target (timeout + 0.5 s)")
    return figure


def _save(figure: Figure, path: Path) -> Path:
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    return path


def main() -> None:
    """Command line: see the module docstring."""
    results = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("benchmarks/results")
    out = Path(sys.argv[2]) if len(sys.argv) > 2 else Path("docs")
    found = [results / f"{name}.json" for name in BACKENDS if (results / f"{name}.json").exists()]
    for path in draw([json.loads(report.read_text()) for report in found], out):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
