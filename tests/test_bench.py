"""``consensus bench``: the JSON report's shape and that every workload produced numbers.

Speed and memory targets are judged only by the benchmarks themselves, never here.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from consensus_testkit import ServerHandle

FIELDS = {
    "workload",
    "ours_p50_ms",
    "ours_p99_ms",
    "baseline",
    "baseline_p50_ms",
    "ratio",
    "target",
    "holds",
}
WORKLOADS = {
    "idle.session",
    "op.fetch",
    "op.put",
    "op.update",
    "op.fenced_update",
    "op.keys",
    "aio.fetch",
    "aio.put",
    "propagation.value",
    "membership.join",
    "failover.2s",
    "detection.unreachable",
    "detection.close",
    "scale.members_200",
    "scale.groups_20x10",
    "scale.watched_1000",
    "scale.observed_300",
}


def bench(url: str, *options: str, timeout: float = 400) -> dict[str, Any]:
    """Run ``consensus bench URL --json OPTIONS`` in a process of its own; its parsed report."""
    done = subprocess.run(
        [sys.executable, "-m", "consensus_api.cli", "bench", url, "--json", "--quick", *options],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def check_rows(report: dict[str, Any], backend: str, expected: set[str]) -> None:
    assert report["backend"] == backend
    rows = {row["workload"]: row for row in report["results"]}
    assert set(rows) == expected
    for row in rows.values():
        assert set(row) >= FIELDS, row
        if row["workload"].startswith("idle."):  # a process at rest: CPU and memory, no latency
            assert isinstance(row["cpu_pct"], float) and row["rss_mb"] > 0, row
        else:
            assert isinstance(row["ours_p50_ms"], float) and row["ours_p50_ms"] > 0, row
        assert row["holds"] in (True, False, None)
        if row["baseline"] is not None and not row["workload"].startswith("failover"):
            assert isinstance(row["baseline_p50_ms"], float) and row["baseline_p50_ms"] > 0, row
            assert isinstance(row["ratio"], float), row
        if row["target"] is not None:
            assert isinstance(row["holds"], bool), row


def test_sqlite_quick(tmp_path: Path) -> None:
    """Every workload on SQLite, with the raw SQLAlchemy baseline for operations."""
    report = bench(f"sqlite:///{tmp_path / 'bench.db'}")
    check_rows(report, "sqlite", WORKLOADS)
    assert report["quick"] is True and report["scale_note"]
    op = next(row for row in report["results"] if row["workload"] == "op.put")
    assert op["baseline"] == "raw SQLAlchemy Core"
    assert op["ours_ops_8t"] > 0 and op["baseline_ops_8t"] > 0
    scale = {row["workload"]: row for row in report["results"] if row["workload"].startswith("scale.")}
    for name in ("scale.members_200", "scale.groups_20x10"):
        assert scale[name]["rss_per_member_kb"] > 0 and "rss_per_key_kb" not in scale[name], scale[name]
    assert scale["scale.watched_1000"]["rss_per_key_kb"] > 0
    observed = scale["scale.observed_300"]
    assert observed["members"] == 300 and observed["observers"] == 2, observed
    assert observed["ours_p99_ms"] >= observed["ours_p50_ms"] >= 0 and observed["observer_cpu_pct"] > 0


def test_zookeeper_watch_and_membership(zookeeper_server: ServerHandle) -> None:
    """On ZooKeeper the raw kazoo watch and tooz are the baselines."""
    report = bench(zookeeper_server.url, "--only", "propagation,membership")
    check_rows(report, "zookeeper", {"propagation.value", "membership.join"})
    rows = {row["workload"]: row for row in report["results"]}
    assert rows["propagation.value"]["baseline"] == "kazoo DataWatch"
    assert rows["membership.join"]["baseline"].startswith("tooz")


def test_postgresql_aio_against_the_raw_asyncio_client(postgresql_server: ServerHandle) -> None:
    """The aio rows against psycopg's AsyncConnection: 1,000 in flight (reads/s) and one at a time."""
    report = bench(postgresql_server.url, "--only", "aio")
    rows = {row["workload"]: row for row in report["results"]}
    assert set(rows) == {"aio.fetch", "aio.put", "aio.fetch.in_flight", "aio.fetch.vs_raw_async"}
    in_flight, single = rows["aio.fetch.in_flight"], rows["aio.fetch.vs_raw_async"]
    for row in (in_flight, single):
        assert row["baseline"] == "raw psycopg AsyncConnection" and isinstance(row["holds"], bool), row
    assert in_flight["in_flight"] == 1_000 and in_flight["ours_p50_ms"] > 0
    assert in_flight["ours_reads_per_s"] > 0 and in_flight["baseline_reads_per_s"] > 0, in_flight
    assert single["ours_p50_ms"] > 0 and single["baseline_p50_ms"] > 0 and isinstance(single["ratio"], float)
