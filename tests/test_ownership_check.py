"""The ownership check of coordinator histories: synthetic histories, then a real chaos run (SQLite,
client kills) that passes, and the same history with one planted double ownership that fails."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from click.testing import CliRunner

from consensus_api.cli import cli
from consensus_chaos.check.ownership import check_run
from consensus_chaos.record.schema import arrow_schema

SECOND = 1_000_000_000


def _row(time: float, process: int, f: str, resource: str | None = None, **fields: Any) -> dict[str, Any]:
    return {
        "run": "r",
        "kind": "coordinator",
        "process": process,
        "client": process,
        "type": "event",
        "f": f,
        "key": resource,
        "value": None,
        "term": 1,
        "members": None,
        "op_id": None,
        "time_ns": int(time * SECOND),
        **fields,
    }


def _nemesis(time: float, f: str, kind: str, op_id: int, target: str) -> dict[str, Any]:
    return {**_row(time, -1, f), "kind": "nemesis", "type": kind, "op_id": op_id, "value": target}


def _handover(*, planted: bool = False) -> list[dict[str, Any]]:
    rows = [
        _row(0, 0, "subscribed", members=["a", "b"]),
        _row(0, 1, "subscribed", members=["a", "b"]),
        _row(1, 0, "assigned", "a"),
        _row(1, 0, "assigned", "b"),
        _row(3, 0, "revoked", "b"),
        _row(4, 1, "assigned", "b"),
        _row(9, 0, "final", members=["a"]),
        _row(9, 1, "final", members=["b"]),
    ]
    return [*rows, _row(2, 1, "assigned", "a")] if planted else rows


def test_a_clean_handover_passes_and_a_planted_double_ownership_is_named() -> None:
    """b moves from process 0 to 1 after its revocation: fine; process 1 starting a while 0 owns it:
    a double ownership of a."""
    assert check_run(_handover()) == []
    found = {(f.finding, f.resource) for f in check_run(_handover(planted=True)) if f.violation}
    assert found == {("double-ownership", "a")}


def test_a_paused_owner_is_reported_as_fenced_and_a_killed_one_releases() -> None:
    """An owner paused by the nemesis when another starts the resource: fenced-overlap, no violation;
    a SIGKILLed owner owns nothing from its kill on; a resource nobody owns at the end is named."""
    paused = [
        _row(0, 0, "subscribed", members=["a"]),
        _row(1, 0, "assigned", "a"),
        _nemesis(2, "pause-client", "invoke", 1, "client 0"),
        _row(3, 1, "assigned", "a"),
        _nemesis(5, "pause-client", "ok", 1, "client 0: paused"),
        _row(5.1, 0, "revoked", "a"),
    ]
    assert [(f.finding, f.violation) for f in check_run(paused)] == [("fenced-overlap", False)]
    killed = [
        _row(0, 0, "subscribed", members=["a", "b"]),
        _row(1, 0, "assigned", "a"),
        _nemesis(2, "kill-client", "invoke", 1, "client 0"),
        _row(3, 1, "assigned", "a"),
        _row(9, 1, "final", members=["a"]),
    ]
    assert [(f.finding, f.resource) for f in check_run(killed)] == [("unowned-at-end", "b")]


def test_an_owner_told_of_its_lost_membership_late_is_fenced_not_a_violation() -> None:
    """The earlier owner stopped the resource only when told its membership was lost (generation -1,
    a member that outlived its session): fenced-overlap; stopping it normally later is a violation."""
    rows = [
        _row(0, 0, "subscribed", members=["a"]),
        _row(1, 0, "assigned", "a", term=3),
        _row(2, 1, "assigned", "a", term=4),
    ]
    late = check_run([*rows, _row(2.1, 0, "revoked", "a", term=-1)])
    assert [(f.finding, f.violation) for f in late] == [("fenced-overlap", False)]
    normal = check_run([*rows, _row(2.1, 0, "revoked", "a", term=4)])
    assert [(f.finding, f.violation) for f in normal] == [("double-ownership", True)]


def _plant(history: Path, out: Path) -> str:
    """Copy ``history`` into ``out`` with one more ``assigned`` row: a resource started by a process
    of another client slot in the middle of an ownership that ended normally (stopped with a real
    generation, or kept to the end), so the overlap cannot be excused as fenced. Returns the
    resource."""
    rows = pq.read_table(history).to_pylist()
    coordinator = sorted((r for r in rows if r["kind"] == "coordinator"), key=lambda r: r["time_ns"])

    def ended_normally(start: dict[str, Any]) -> bool:
        stop = next(
            (
                r
                for r in coordinator
                if r["f"] == "revoked"
                and (r["process"], r["key"]) == (start["process"], start["key"])
                and r["time_ns"] > start["time_ns"] + 1
            ),
            None,
        )
        return stop is None or stop["term"] not in (None, -1)

    first = next(r for r in coordinator if r["f"] == "assigned" and ended_normally(r))
    other = next(r for r in coordinator if r["client"] != first["client"])
    planted = {
        **first,
        "process": other["process"],
        "client": other["client"],
        "time_ns": first["time_ns"] + 1,
    }
    out.mkdir()
    pq.write_table(pa.Table.from_pylist([*rows, planted], schema=arrow_schema()), out / history.name)
    return str(first["key"])


def test_chaos_coordinator_run_passes_and_the_planted_one_fails(tmp_path: Path) -> None:
    """consensus chaos --workload coordinator with client kills, then consensus ownership: ok; the
    same history with one planted double ownership: exit 1, naming the resource."""
    runner = CliRunner()
    out = tmp_path / "runs"
    workload = ["--server", "sqlite", "--workload", "coordinator", "--duration", "6", "--clients", "3"]
    faults = ["--faults", "kill", "--fault-interval", "1.5", "--seed", "3"]
    chaos = runner.invoke(cli, ["chaos", *workload, *faults, "--out", str(out)])
    assert chaos.exit_code == 0, chaos.output
    clean = runner.invoke(cli, ["ownership", str(out), "--engine", "local", "--json"])
    assert clean.exit_code == 0, clean.output
    assert json.loads(clean.output)["ok"] is True
    history = next(out.glob("*.parquet"))
    resource = _plant(history, tmp_path / "planted")
    planted = runner.invoke(cli, ["ownership", str(tmp_path / "planted"), "--engine", "local"])
    assert planted.exit_code == 1
    assert f"double-ownership {resource}" in planted.output
