"""The cut-over checks of ``consensus check`` (``consensus_chaos.check.cutover``) on small hand-written
histories: a clean migration passes every check; each planted defect (a lost update, an acknowledged
increment missing on the new store, two leaders of a term, a token of the new store not above the old
one's, tokens out of grant order, a term out of range, a write from a deposed leader) fails exactly the
check it concerns; the same verdicts through ``check_history`` on both engines."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from consensus_chaos.check import check_history
from consensus_chaos.check.cutover import check_run
from consensus_chaos.record.convert import write_history
from consensus_chaos.record.schema import COLUMNS, OUT_OF_RANGE

SECOND = 1_000_000_000
SERVICE = "chaos/r/s0"
LOCK = "chaos/r/l0"


class History:
    """Rows of run ``r``: each client slot one process; the migration driver is process -2."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.ops = 0

    def row(self, time: float, process: int, kind: str, type_: str, f: str, **fields: Any) -> None:
        row = dict.fromkeys(COLUMNS) | {"run": "r", "backend": "sqlite->sqlite", "kind": kind}
        row |= {"process": process, "client": process, "type": type_, "f": f, "time_ns": int(time * SECOND)}
        self.rows.append(row | fields)

    def op(
        self, process: int, call: float, ret: float | None, f: str, done: str = "ok", **fields: Any
    ) -> None:
        """One client operation from ``call`` to ``ret`` (None: it never returned); ``fields`` on the
        invoke, ``store`` and the ``ok_*`` ones (without the prefix) on the completion."""
        self.ops += 1
        shown = {name[3:]: value for name, value in fields.items() if name.startswith("ok_")}
        store = fields.pop("store", None)
        asked = {name: value for name, value in fields.items() if not name.startswith("ok_")}
        self.row(call, process, "cutover", "invoke", f, op_id=self.ops, **asked)
        if ret is not None:
            self.row(ret, process, "cutover", done, f, op_id=self.ops, store=store, **asked | shown)

    def cas(self, process: int, call: float, value: int, store: str = "old", *, done: str = "ok") -> None:
        self.op(process, call, call + 0.01, "cas", done, key="c0", value=str(value), store=store)

    def grant(self, process: int, call: float, term: int, store: str, f: str = "leadership") -> None:
        name = LOCK if f == "acquire" else SERVICE
        extra = {"key": LOCK} if f == "acquire" else {}
        self.op(process, call, call + 0.01, f, service=name, ok_term=term, ok_leader=f"p{process}.{term}",
                store=store, **extra)  # fmt: skip

    def write(
        self, process: int, call: float, term: int, store: str, *, done: str = "ok", name: str = SERVICE
    ) -> None:
        self.op(process, call, call + 0.01, "write", done, key="f", value=f"w{call}", service=name, term=term,
                leader=f"p{process}.{term}", store=store)  # fmt: skip

    def cutover(self, call: float, ret: float) -> None:
        self.ops += 1
        for time, type_ in ((call, "invoke"), (ret, "ok")):
            self.row(time, -2, "migration", type_, "cutover", op_id=self.ops, client=-2)

    def final(self, time: float, value: int | None) -> None:
        self.row(
            time, -2, "migration", "event", "final", key="c0", value=None if value is None else str(value)
        )

    def findings(self) -> list[tuple[str, str]]:
        """(check, key) of every violation; every check summarized once."""
        out = check_run(self.rows).to_pylist()
        assert sorted(r["check"] for r in out if r["verdict"] == "summary") == sorted(
            ["cutover", "cutover-writes", "cutover-leaders", "cutover-tokens", "cutover-fencing"]
        )
        return sorted((r["check"], r["key"]) for r in out if r["verdict"] == "violation")


def clean() -> History:
    """Two clients increment, lead and hold the lock on the old store, the cut-over at 5-6 s, then on
    the new store (terms above the floor); the new store holds the last increment at the end."""
    history = History()
    history.cas(0, 1, 1)
    history.cas(1, 2, 2)
    history.grant(0, 1, 100, "old")
    history.write(0, 2, 100, "old")
    history.grant(1, 3, 120, "old", f="acquire")
    history.write(1, 3.5, 120, "old", name=LOCK)
    history.cutover(5, 6)
    history.write(0, 5.5, 100, "old", done="fail")  # refused: sealed
    history.write(0, 6.5, 100, "new", done="fail")  # refused: fenced by the floor
    history.cas(1, 7, 3, store="new")
    history.cas(0, 7.5, 3, store="new", done="fail")  # lost the race: a version conflict
    history.grant(0, 8, 2**40, "new")
    history.write(0, 8.5, 2**40, "new")
    history.grant(1, 9, 2**40 + 5, "new", f="acquire")
    history.final(12, 3)
    return history


def test_a_clean_cutover_passes() -> None:
    assert clean().findings() == []


def test_a_lost_update_and_a_missing_increment_fail_the_writes_check() -> None:
    twice = clean()
    twice.cas(0, 7.2, 3, store="old")  # acknowledged on the unsealed old store after the cut-over
    assert twice.findings() == [("cutover-writes", "c0")]
    missing = clean()
    missing.cas(1, 10, 4, store="new")
    assert missing.findings() == [("cutover-writes", "c0")]  # the new store still holds 3
    phantom = clean()
    phantom.final(12.5, 9)
    assert phantom.findings() == [("cutover-writes", "c0")]
    unknown = clean()
    unknown.op(1, 10, None, "cas", key="c0", value="4")  # never returned: it may have taken effect
    unknown.final(12.5, 4)
    assert unknown.findings() == []


def test_two_leaders_of_one_term_fail() -> None:
    history = clean()
    history.row(8.2, 1, "cutover", "event", "leader", service=SERVICE, leader="someone", term=2**40)
    assert history.findings() == [("cutover-leaders", SERVICE)]


def test_tokens_must_rise_across_the_cutover_stay_in_range_and_follow_the_grant_order() -> None:
    below = clean()
    below.grant(1, 10, 90, "new")  # the new store issued a term below the old store's 100
    assert below.findings() == [("cutover-tokens", SERVICE)]
    order = clean()
    order.grant(0, 10, 2**40 + 1, "new", f="acquire")  # called after token 2^40 + 5 had been returned
    assert order.findings() == [("cutover-tokens", LOCK)]
    huge = clean()
    huge.op(0, 10, 10.1, "leadership", service=SERVICE, store="new", ok_error=f"{OUT_OF_RANGE}: {2**64}")
    assert huge.findings() == [("cutover-tokens", SERVICE)]


def test_a_write_of_a_deposed_leader_or_a_lost_lock_fails_the_fencing_check() -> None:
    stale = clean()
    stale.write(1, 3.8, 100, "old")  # term 100 is still current on the old store then
    assert stale.findings() == []
    after_higher = clean()
    after_higher.write(0, 9.5, 2**40 - 1, "new")  # below the term 2^40 seen at 8.01
    assert after_higher.findings() == [("cutover-fencing", SERVICE)]
    deposed = clean()
    deposed.write(0, 6.2, 100, "old")  # the old leadership, accepted after the cut-over completed
    assert deposed.findings() == [("cutover-fencing", SERVICE)]
    lost = clean()
    lost.write(1, 6.3, 120, "old", name=LOCK)  # the old lease, accepted after the cut-over
    assert lost.findings() == [("cutover-fencing", LOCK)]


def test_a_cutover_that_never_completed_fails() -> None:
    history = clean()
    history.rows = [row for row in history.rows if row["f"] != "cutover"]
    assert history.findings() == [("cutover", "migration")]


@pytest.fixture
def stops_spark() -> Iterator[None]:
    """The Spark session ``check_history`` started is stopped after the test."""
    yield
    from pyspark.sql import SparkSession  # noqa: PLC0415 - an optional dependency

    active = SparkSession.getActiveSession()
    if active is not None:
        active.stop()


@pytest.mark.timeout(300)
@pytest.mark.usefixtures("stops_spark")
def test_both_engines_give_the_same_verdicts(tmp_path: Path) -> None:
    passing, failing = clean(), clean()
    failing.cas(0, 7.2, 3, store="old")
    failing.write(0, 6.2, 100, "old")
    for history, name in ((passing, "passing"), (failing, "failing")):
        (tmp_path / name).mkdir()
        write_history(sorted(history.rows, key=lambda row: row["time_ns"]), tmp_path / name / "r.parquet")
    for name, code in (("passing", 0), ("failing", 1)):
        outcomes = [check_history(tmp_path / name, engine) for engine in ("local", "spark")]
        for outcome in outcomes:
            assert outcome.exit_code == code
            assert outcome.checks["cutover-writes"].objects == 1
        local, spark = (
            {(f["check"], f["key"], f["detail"]["message"]) for f in o.findings} for o in outcomes
        )
        assert local == spark
        assert {check for check, _, _ in local} == ({"cutover-writes", "cutover-fencing"} if code else set())
