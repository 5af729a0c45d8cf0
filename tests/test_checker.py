"""The history checker on hand-made histories, with both engines and through the CLI."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from consensus_api.cli import cli
from consensus_chaos.check import Budget, check_history, versioned_register, wgl
from consensus_chaos.check.report import render
from consensus_chaos.record.convert import write_history
from consensus_chaos.record.schema import COLUMNS

pytest.importorskip("pyarrow")

K, S, G = "ns/k", "ns/svc", "ns/grp"


class History:
    """A hand-made history of one run; times are microseconds."""

    def __init__(self, run: str) -> None:
        self.run = run
        self.rows: list[dict[str, Any]] = []
        self.ops = 0

    def _row(self, kind: str, process: int, type_: str, f: str, t: int, **fields: Any) -> None:
        row = dict.fromkeys(COLUMNS)
        row.update(
            run=self.run,
            backend="test",
            kind=kind,
            process=process,
            client=process,
            type=type_,
            f=f,
            time_ns=t * 1000,
            **fields,
        )
        self.rows.append(row)

    def op(
        self,
        process: int,
        f: str,
        call: int,
        ret: int | None,
        outcome: str = "ok",
        *,
        kind: str = "kv",
        key: str | None = K,
        out: dict[str, Any] | None = None,
        **fields: Any,
    ) -> None:
        """An operation; ``ret`` None leaves it without completion (its process crashed)."""
        self.ops += 1
        common = {"key": key, "op_id": self.ops, **fields}
        self._row(kind, process, "invoke", f, call, **common)
        if ret is not None:
            self._row(kind, process, outcome, f, ret, **{**common, **(out or {})})

    def event(self, process: int, f: str, t: int, *, kind: str = "kv", **fields: Any) -> None:
        self._row(kind, process, "event", f, t, **fields)

    def save(self, directory: Path) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        write_history(sorted(self.rows, key=lambda r: r["time_ns"]), directory / f"{self.run}.parquet")
        return directory


def linearizable() -> History:
    """Concurrency, indeterminate writes, listeners, an election with fencing, a group."""
    h = History("fine")
    h.op(0, "put", 0, 10, value="a", out={"version": 1})
    h.op(1, "fetch", 5, 15)  # concurrent with the put: absent
    h.op(2, "update", 12, 30, "info", value="b", error="OperationTimeoutError")
    h.op(1, "fetch", 20, 25, out={"value": "a", "version": 1})
    h.op(0, "fetch", 35, 40, out={"value": "b", "version": 2})
    h.op(3, "put", 36, 50, "fail", value="c", error="KeyExistsError")
    h.op(0, "update", 41, 45, value="d", expected_version=2, out={"version": 3})
    h.op(1, "delete", 42, 48, "fail", expected_version=2, error="VersionConflictError")
    h.op(4, "put", 60, None, value="e")  # crashed: never took effect
    h.op(0, "fetch", 80, 90, out={"value": "d", "version": 3})
    h.event(9, "watch", 1, key=K)
    for t, value, version in ((2, None, None), (11, "a", 1), (36, "b", 2), (46, "d", 3)):
        h.event(9, "value", t, key=K, value=value, version=version)
    h.event(9, "final", 95, key=K, value="d", version=3)
    election: dict[str, Any] = {"kind": "election", "key": None, "service": S}
    h.op(5, "nominate", 0, 5, value="c1", out={"leader": "c1"}, **election)
    h.op(5, "leadership", 6, 8, out={"leader": "c1", "term": 1}, **election)
    h.op(5, "put", 9, 12, key="ns/fenced", value="f1", service=S, term=1, out={"version": 1})
    h.event(9, "leader", 7, leader="c1", term=1, **election)
    h.event(9, "leader", 30, **election)
    h.event(9, "leader", 31, leader="c2", term=2, **election)
    h.op(5, "update", 40, 44, "fail", key="ns/fenced", value="f2", service=S, term=1, error="FencedError")
    h.event(9, "final", 95, leader="c2", term=2, **election)
    group: dict[str, Any] = {"kind": "group", "key": G}
    h.op(6, "join", 0, 4, value="m1", **group)
    h.event(9, "view", 5, members=["m1"], **group)
    h.op(6, "leave", 10, 14, value="m1", **group)
    h.event(9, "view", 15, members=[], **group)
    h.event(9, "final", 95, members=[], **group)
    return h


def lost_write() -> History:
    h = History("lost-write")
    h.op(0, "put", 0, 10, value="a", out={"version": 1})
    h.op(1, "fetch", 20, 30)
    return h


def stale_read() -> History:
    h = History("stale-read")
    h.op(0, "put", 0, 10, value="a", out={"version": 1})
    for i in range(10):  # noise the slice should not keep
        h.op(2, "fetch", 11 + i, 11 + i, out={"value": "a", "version": 1})
    h.op(0, "update", 30, 40, value="b", out={"version": 2})
    h.op(1, "fetch", 50, 60, out={"value": "a", "version": 1})
    return h


def phantom_read() -> History:
    h = History("phantom-read")
    h.op(0, "fetch", 0, 10, out={"value": "never-written", "version": 5})
    return h


def two_leaders() -> History:
    h = History("two-leaders")
    h.event(1, "leader", 10, kind="election", service=S, leader="c1", term=3)
    h.event(2, "leader", 12, kind="election", service=S, leader="c2", term=3)
    return h


def stale_fenced_write() -> History:
    h = History("stale-fence")
    h.op(3, "put", 0, 5, key="ns/fenced", value="w", out={"version": 3})
    h.event(1, "leader", 50, kind="election", service=S, leader="c2", term=2)
    h.op(3, "update", 60, 70, key="ns/fenced", value="x", service=S, term=1, out={"version": 4})
    return h


def listener_out_of_order() -> History:
    h = History("listener-order")
    h.op(0, "put", 0, 10, value="a", out={"version": 1})
    h.op(0, "update", 20, 30, value="b", out={"version": 2})
    h.event(1, "watch", 1, key=K)
    h.event(1, "value", 35, key=K, value="b", version=2)
    h.event(1, "value", 40, key=K, value="a", version=1)
    return h


ELECTION: dict[str, Any] = {"kind": "election", "key": None, "service": S}


def election_reads_go_back() -> History:
    """leadership() returns term 63, and a read invoked strictly later returns term 61."""
    h = History("election-reads-back")
    h.op(1, "leadership", 0, 10, out={"leader": "c63", "term": 63}, **ELECTION)
    h.op(2, "leadership", 20, 30, out={"leader": "c61", "term": 61}, **ELECTION)
    return h


GROUP: dict[str, Any] = {"kind": "group", "key": G}


def member_came_back() -> History:
    """An observer sees m1 leave, then m1 again without a new join."""
    h = History("member-back")
    h.op(0, "join", 0, 4, value="m1", **GROUP)
    h.event(1, "view", 5, members=["m1"], **GROUP)
    h.op(0, "leave", 10, 14, value="m1", **GROUP)
    h.event(1, "view", 15, members=[], **GROUP)
    h.event(1, "view", 20, members=["m1"], **GROUP)
    return h


def phantom_member() -> History:
    """A membership read lists a member nobody joined."""
    h = History("phantom-member")
    h.op(0, "join", 0, 4, value="m1", **GROUP)
    h.op(1, "members", 5, 8, out={"members": ["m1", "ghost"]}, **GROUP)
    return h


def final_views_disagree() -> History:
    """Two settled observers end on different memberships."""
    h = History("final-disagree")
    h.op(0, "join", 0, 4, value="m1", **GROUP)
    for process, members in ((1, ["m1"]), (2, [])):
        h.event(process, "view", 5, members=members, **GROUP)
        h.event(process, "final", 95, members=members, **GROUP)
    return h


VIOLATIONS: dict[str, tuple[Callable[[], History], str]] = {
    "lost-write": (lost_write, "linearizability"),
    "stale-read": (stale_read, "linearizability"),
    "phantom-read": (phantom_read, "linearizability"),
    "two-leaders": (two_leaders, "election"),
    "election-reads-back": (election_reads_go_back, "election"),
    "stale-fence": (stale_fenced_write, "election"),
    "listener-order": (listener_out_of_order, "listeners"),
    "member-back": (member_came_back, "membership"),
    "phantom-member": (phantom_member, "membership"),
    "final-disagree": (final_views_disagree, "membership"),
}


def run_cli(*args: str) -> Any:
    return CliRunner().invoke(cli, ["check", *args], catch_exceptions=False)


def verdicts(outcome: Any) -> set[tuple[str, str, str]]:
    return {(f["run"], f["check"], f["verdict"]) for f in outcome.findings}


def test_linearizable_history_passes(tmp_path: Path) -> None:
    directory = linearizable().save(tmp_path)
    outcome = check_history(directory, "local")
    assert outcome.findings == []
    assert {name: c.verdict for name, c in outcome.checks.items()} == dict.fromkeys(
        ("linearizability", "listeners", "election", "membership"), "ok"
    )
    result = run_cli(str(directory), "--engine", "local", "--json")
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("name", sorted(VIOLATIONS))
def test_violation_is_caught(tmp_path: Path, name: str) -> None:
    build, check = VIOLATIONS[name]
    directory = build().save(tmp_path)
    outcome = check_history(directory, "local")
    assert (name, check, "violation") in verdicts(outcome)
    assert outcome.checks[check].verdict == "violation"
    assert run_cli(str(directory), "--engine", "local").exit_code == 1


def test_slice_is_small_and_keeps_the_failing_read(tmp_path: Path) -> None:
    outcome = check_history(stale_read().save(tmp_path), "local")
    [finding] = outcome.findings
    timeline = finding["detail"]["timeline"]
    assert len(timeline) <= 2  # the update (a fixed state) and the stale fetch, without the noise
    assert [item["label"] for item in timeline if item["mark"]] == ["fetch() -> a@1"]
    assert "<svg class='slice'" in render(outcome)


def test_overlapping_leadership_reads_may_disagree(tmp_path: Path) -> None:
    """Reads that overlap in time may be linearized either way: no violation."""
    h = History("election-reads-overlap")
    h.op(1, "leadership", 0, 30, out={"leader": "c63", "term": 63}, **ELECTION)
    h.op(2, "leadership", 20, 40, out={"leader": "c61", "term": 61}, **ELECTION)
    assert check_history(h.save(tmp_path), "local").findings == []


def test_listener_added_again_gets_the_current_version_again(tmp_path: Path) -> None:
    """Rule 1: a re-added listener's first event is the current state, which it may have seen before."""
    h = History("listener-rewatch")
    h.op(0, "put", 0, 10, value="a", out={"version": 77})
    h.event(1, "watch", 1, key=K)
    h.event(1, "value", 11, key=K, value="a", version=77)
    h.event(1, "unwatch", 20, key=K)
    h.event(1, "watch", 21, key=K)
    h.event(1, "value", 22, key=K, value="a", version=77)
    h.event(1, "final", 30, key=K, value="a", version=77)
    assert check_history(h.save(tmp_path / "ok"), "local").findings == []
    h.event(1, "unwatch", 40, key=K)  # and going back below what it saw is still caught
    h.event(1, "watch", 41, key=K)
    h.event(1, "value", 42, key=K, value="a", version=76)
    assert ("listener-rewatch", "listeners", "violation") in verdicts(
        check_history(h.save(tmp_path / "bad"), "local")
    )


def test_listener_sees_a_delete_after_versions(tmp_path: Path) -> None:
    """A deleted key's event has no version: after versions were seen it is no step back (the chaos
    run on SQLite found a crash here), and a re-added listener's first event may be the delete."""
    h = History("listener-delete")
    h.op(0, "put", 0, 10, value="a", out={"version": 1})
    h.op(0, "delete", 12, 15)
    h.event(1, "watch", 1, key=K)
    h.event(1, "value", 11, key=K, value="a", version=1)
    h.event(1, "value", 16, key=K, value=None, version=None)
    h.event(1, "unwatch", 20, key=K)
    h.event(1, "watch", 21, key=K)
    h.event(1, "value", 22, key=K, value=None, version=None)
    h.event(1, "final", 30, key=K, value=None, version=None)
    assert check_history(h.save(tmp_path / "ok"), "local").findings == []


def test_info_write_of_a_value_another_write_wrote(tmp_path: Path) -> None:
    """A timed-out update writes "a", which the put wrote too: the reads of "a" are the put's, and the update
    may never have taken effect (so it must not be given the first sighting of "a" as its return)."""
    h = History("repeated-value")
    h.op(0, "put", 0, 10, value="a", out={"version": 1})
    h.op(2, "update", 11, 13, "info", value="a", error="OperationTimeoutError")
    h.op(1, "fetch", 12, 14, out={"value": "a", "version": 1})
    h.op(1, "fetch", 20, 22, out={"value": "a", "version": 1})
    h.event(3, "watch", 1, key=K)
    h.event(3, "value", 15, key=K, value="a", version=1)
    h.event(3, "final", 30, key=K, value="a", version=1)
    directory = h.save(tmp_path)
    assert check_history(directory, "local").findings == []
    assert run_cli(str(directory), "--engine", "local").exit_code == 0


def test_exhausted_budget_is_unknown_exit_3(tmp_path: Path) -> None:
    h = History("hard")
    for p in range(16):  # sixteen concurrent writes of unknown outcome, then an impossible read
        h.op(p, "update", p, 1000 + p, "info", value=f"v{p}", error="OperationTimeoutError")
    h.op(20, "put", 0, 1, value="v", out={"version": 1})
    h.op(21, "fetch", 2000, 2001, out={"value": "zz", "version": 9})
    directory = h.save(tmp_path)
    outcome = check_history(directory, "local", Budget(seconds=10, states=1000))
    assert outcome.checks["linearizability"].verdict == "unknown"
    assert run_cli(str(directory), "--engine", "local", "--state-budget", "1000").exit_code == 3


def test_overlapping_ops_of_one_process_are_invalid_exit_2(tmp_path: Path) -> None:
    h = History("invalid")
    h.op(0, "put", 0, 10, value="a", out={"version": 1})
    h.op(0, "fetch", 5, 15, out={"value": "a", "version": 1})
    assert run_cli(str(h.save(tmp_path)), "--engine", "local").exit_code == 2


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    assert run_cli(str(tmp_path), "--engine", "local").exit_code == 2  # no history in it
    assert run_cli(str(tmp_path / "missing")).exit_code == 2


def test_indeterminate_write_may_take_effect_or_not() -> None:
    budget = wgl.Budget()
    put_unknown = (versioned_register.PUT, "a", None, versioned_register.UNKNOWN, None, None)
    read_a = (versioned_register.FETCH, None, None, versioned_register.OK, "a", 7)
    read_absent = (versioned_register.FETCH, None, None, versioned_register.OK, None, None)
    for read in (read_a, read_absent):
        ops = [put_unknown, read]
        result = wgl.search(
            [0, 20],
            [None, 30],
            ops,
            versioned_register.step,
            initial=versioned_register.INITIAL,
            budget=budget,
        )
        assert result.verdict == wgl.OK
    ops = [put_unknown, read_a, read_absent]
    both = wgl.search(
        [0, 20, 40],
        [None, 30, 50],
        ops,
        versioned_register.step,
        initial=versioned_register.INITIAL,
        budget=budget,
    )
    assert both.verdict == wgl.ILLEGAL


# The Spark engine (one session for the module: the ``spark`` fixture of conftest.py).


def test_spark_engine_reaches_the_local_verdicts(tmp_path: Path, spark: Any) -> None:
    for build, _ in VIOLATIONS.values():
        build().save(tmp_path)
    linearizable().save(tmp_path)
    local = check_history(tmp_path, "local")
    distributed = check_history(tmp_path, "spark", session=spark)
    assert verdicts(distributed) == verdicts(local)
    assert verdicts(local) == {(name, check, "violation") for name, (_, check) in VIOLATIONS.items()}
    assert {n: (c.objects, c.ops) for n, c in distributed.checks.items()} == {
        n: (c.objects, c.ops) for n, c in local.checks.items()
    }


def test_spark_cli_exit_codes(tmp_path: Path, spark: Any) -> None:
    fine = linearizable().save(tmp_path / "fine")
    bad = lost_write().save(tmp_path / "bad")
    assert run_cli(str(fine), "--master", "local[2]").exit_code == 0
    result = run_cli(str(bad), "--master", "local[2]", "--json", "--report", str(tmp_path / "r.html"))
    assert result.exit_code == 1
    assert "<svg class='timeline'" in (tmp_path / "r.html").read_text()
