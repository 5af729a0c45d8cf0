"""The locks check of ``consensus check``: synthetic histories, then a real chaos run of the locks
workload (SQLite, client kills, pauses and expiries) that passes on both engines, and the same history
with one planted second holder that fails."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from consensus_api.cli import cli
from consensus_chaos.check.locks import check_run
from consensus_chaos.record.schema import arrow_schema

SECOND = 1_000_000_000


class History:
    """Synthetic lock rows of run ``r``: each client slot is one process."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.ops = 0

    def row(self, time: float, slot: int, kind: str, f: str, **fields: Any) -> None:
        base = {"run": "r", "kind": "lock", "process": slot, "client": slot, "type": kind, "f": f}
        fields.setdefault("value", None)
        self.rows.append({**base, "key": "L", "term": None, "leader": None, "op_id": None, "error": None}
                         | {"time_ns": int(time * SECOND), **fields})  # fmt: skip

    def hold(self, slot: int, call: float, start: float, release: float | None, token: int, **kw: Any) -> str:
        """An acquire from ``call`` returning at ``start``, and a release at ``release`` (None: never)."""
        holder, mode = f"h{slot}.{token}", kw.get("mode", "exclusive")
        self.ops += 1
        self.row(call, slot, "invoke", "acquire", value=mode, op_id=self.ops)
        self.row(start, slot, "ok", "acquire", value=mode, op_id=self.ops, term=token, leader=holder)
        if release is not None:
            self.ops += 1
            done = {"value": mode, "op_id": self.ops, "term": token, "leader": holder}
            self.row(release, slot, "invoke", "release", **done)
            self.row(release + 0.01, slot, "ok", "release", **done)
        return holder

    def nemesis(self, start: float, end: float, f: str, slot: int) -> None:
        self.ops += 1
        for time, kind in ((start, "invoke"), (end, "ok")):
            self.row(time, -1, kind, f, value=f"client {slot}", op_id=self.ops)
            self.rows[-1].update(kind="nemesis", process=-1, client=-1)

    def check(self) -> tuple[list[tuple[str, str]], dict[str, int]]:
        """(check, verdict) of the findings, and the fenced overlaps per lock."""
        out = check_run(self.rows).to_pylist()
        assert [r["objects"] for r in out if r["verdict"] == "summary"] == [1]
        fenced = {r["key"]: len(r["values"]) for r in out if r["check"] == "fenced-overlap"}
        return [(r["check"], r["verdict"]) for r in out if r["verdict"] not in ("summary", "stat")], fenced


def test_handovers_and_shared_holders_pass_and_a_second_exclusive_holder_is_a_violation() -> None:
    history = History()
    history.hold(0, 0, 1, 2, token=5)
    history.hold(1, 0.5, 2.1, 3, token=7)
    history.hold(2, 3.0, 3.1, 4, token=8, mode="shared")
    history.hold(0, 3.05, 3.2, 4, token=9, mode="shared")
    assert history.check() == ([], {})
    history.hold(2, 1.0, 1.5, 1.8, token=6)  # while slot 0 holds token 5
    assert history.check() == ([("locks", "violation")], {})


def test_an_overlap_is_fenced_when_the_earlier_holder_was_told_late_or_paused() -> None:
    told = History()
    holder = told.hold(0, 0, 1, None, token=5)
    told.hold(1, 0.5, 2, 3, token=6)
    told.row(2.5, 0, "event", "lost", term=5, leader=holder)
    assert told.check() == ([], {"L": 1})
    # it let go before it was told (its session was lost meanwhile): fenced when told soon enough
    for told_at, fenced in ((4.0, True), (9.0, False)):
        released = History()
        holder = released.hold(0, 0, 1, 3, token=5)
        released.hold(1, 0.5, 2, 3.5, token=6)
        released.row(told_at, 0, "event", "lost", term=5, leader=holder)
        assert released.check() == (([], {"L": 1}) if fenced else ([("locks", "violation")], {}))
    paused = History()
    paused.hold(0, 0, 1, 4, token=5)
    paused.nemesis(1.5, 3.5, "pause-client", 0)
    paused.hold(1, 0.5, 2, 3, token=6)
    assert paused.check() == ([], {"L": 1})


def test_an_older_grant_returned_late_to_a_faulted_client_is_a_fenced_overlap() -> None:
    """A lower token returned after a higher one, to a client whose session the nemesis expired inside
    its acquire: its grant came first and was deposed; without the fault it is a violation."""
    for faulted in (True, False):
        history = History()
        history.hold(0, 0.5, 2.0, 3, token=32)
        if faulted:
            history.nemesis(1.0, 1.1, "expire-session", 1)
        history.hold(1, 0.2, 2.1, 4, token=31)
        expected = ([], {"L": 1}) if faulted else ([("locks", "violation")], {})
        assert history.check() == expected


def test_a_killed_holder_stops_holding_at_the_kill() -> None:
    history = History()
    history.hold(0, 0, 1, None, token=5)
    history.nemesis(1.5, 1.6, "kill-client", 0)
    history.hold(1, 0.5, 4, 5, token=6)
    assert history.check() == ([], {})


def test_tokens_must_increase_with_the_grant_order() -> None:
    backwards = History()
    backwards.hold(0, 0, 1, 2, token=7)
    backwards.hold(1, 0.5, 2.1, 3, token=6)
    assert backwards.check() == ([("locks", "violation")], {})
    # the same, but the later acquirer's client was paused inside its acquire: its grant may be an older
    # one (fenced since), so the returns do not order the grants
    paused = History()
    paused.hold(0, 0, 1, 2, token=7)
    paused.nemesis(0.8, 1.9, "pause-client", 1)
    paused.hold(1, 0.5, 2.1, 3, token=6)
    assert paused.check() == ([], {})
    # two shared leases whose acquires overlap may be granted in either order
    shared = History()
    shared.hold(0, 0, 1.2, 2, token=7, mode="shared")
    shared.hold(1, 0.5, 1.1, 3, token=8, mode="shared")
    assert shared.check() == ([], {})


def _plant(history: Path, out: Path) -> str:
    """Copy ``history`` into ``out`` with one more exclusive grant: another process gets a lock 1 ms
    after an exclusive holder did, with the next token. Returns the lock."""
    rows = pq.read_table(history).to_pylist()
    grants = [r for r in rows if r["kind"] == "lock" and r["f"] == "acquire" and r["type"] == "ok"]
    first = next(r for r in grants if r["value"] == "exclusive")
    other = next(r for r in rows if r["kind"] == "lock" and r["process"] != first["process"])
    op_id = max(r["op_id"] for r in rows if r["op_id"] is not None) + 1
    planted = {**first, "process": other["process"], "client": other["client"], "op_id": op_id}
    invoke = {**planted, "type": "invoke", "term": None, "leader": None, "time_ns": first["time_ns"]}
    planted.update(time_ns=first["time_ns"] + 1_000_000, leader="planted", term=first["term"] + 1)
    out.mkdir()
    pq.write_table(pa.Table.from_pylist([*rows, invoke, planted], schema=arrow_schema()), out / history.name)
    return str(first["key"])


@pytest.fixture
def stops_spark() -> Iterator[None]:
    """The Spark session the CLI started (``getOrCreate``) is stopped after the test."""
    yield
    from pyspark.sql import SparkSession  # noqa: PLC0415 - an optional dependency

    active = SparkSession.getActiveSession()
    if active is not None:
        active.stop()


@pytest.mark.timeout(300)
@pytest.mark.usefixtures("stops_spark")
def test_chaos_locks_run_passes_and_the_planted_one_fails(tmp_path: Path) -> None:
    """consensus chaos --workload locks under client kills, pauses and expiries, then consensus check:
    ok on the local engine and Spark; the same history with a planted second holder: exit 1 on both."""
    runner = CliRunner()
    out = tmp_path / "runs"
    workload = ["--server", "sqlite", "--workload", "locks", "--duration", "8", "--clients", "4"]
    faults = ["--faults", "kill,pause,expire", "--fault-interval", "1.5", "--seed", "5"]
    chaos = runner.invoke(cli, ["chaos", *workload, *faults, "--out", str(out)])
    assert chaos.exit_code == 0, chaos.output
    for engine in (["--engine", "local"], ["--master", "local[2]"]):
        clean = runner.invoke(cli, ["check", str(out), *engine, "--json"])
        assert clean.exit_code == 0, clean.output
        locks = json.loads(clean.output)["checks"]["locks"]
        assert locks["verdict"] == "ok" and locks["objects"] == 2 and locks["ops"] > 20, locks
    lock = _plant(next(out.glob("*.parquet")), tmp_path / "planted")
    for engine in (["--engine", "local"], ["--master", "local[2]"]):
        planted = runner.invoke(cli, ["check", str(tmp_path / "planted"), *engine, "--json"])
        assert planted.exit_code == 1, planted.output
        [finding] = json.loads(planted.output)["findings"]
        assert (finding["check"], finding["key"], finding["verdict"]) == ("locks", lock, "violation")
        assert "unfenced" in finding["message"]
