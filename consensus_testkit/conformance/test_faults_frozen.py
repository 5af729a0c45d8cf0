"""Faults: a leader frozen (SIGSTOP) in the middle of a fenced write.

The child stops itself while the write is in progress (``worker._freeze_in_write``):
on SQL backends the test kit's ``TestProfile.stop_inside_write`` stops it inside
the write's transaction, after its statements and before its commit, holding
its locks; elsewhere while its request is in flight. So the freeze lands inside
the write every time, not 1 run in 20. Bounds as in ``test_faults`` (``faults_support``); what the tests
measure is summarised in docs/guarantees.md ("client frozen mid-transaction").
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from consensus_api import (
    BackendUnavailableError,
    LeaderChanged,
    Leadership,
    OperationTimeoutError,
    Session,
    SessionState,
    Versioned,
)
from consensus_testkit.conformance.faults_support import (
    CALL_LIMIT,
    FAULT_OPTIONS,
    SESSION_TIMEOUT,
    Record,
    fenced_lines,
    leading_child,
    loss_bound,
    timed_call,
)
from consensus_testkit.conformance.helpers import EventLog, SessionFactory, unique, wait_until
from consensus_testkit.conformance.plugin import WorkerFactory
from consensus_testkit.conformance.prober import Prober
from consensus_testkit.conformance.worker import WorkerProcess

#: The writes a frozen leader has queued when it resumes: each must fail with FencedError.
QUEUED = (("update", "shared"), ("delete", "owned"), ("put", "fresh"))


def _stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped by a signal (``/proc/PID/stat``; Linux)."""
    stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii")
    return stat.rpartition(")")[2].split()[0] == "T"


def _freeze_mid_write(child: WorkerProcess, operation: str, key: str) -> float:
    """Have ``child`` (a leading ``hold`` worker) stop itself in a fenced ``operation`` of ``key``;
    the ``time.monotonic()`` at which it was seen stopped."""
    child.send(f"FREEZE_IN_WRITE {operation} {key}")
    wait_until(lambda: _stopped(child.pid), what="the child stopped mid-write", interval=0.002)
    return time.monotonic()


def _contended(open_session: SessionFactory, spawn_worker: WorkerFactory, group: str, service: str) -> tuple[
    Session, WorkerProcess, int, EventLog[LeaderChanged]
]:  # fmt: skip
    """A contender session queued behind a child that leads ``service``, and its leader listener."""
    contender = open_session(**FAULT_OPTIONS)
    child, term = leading_child(spawn_worker, group, "frozen", service)
    assert contender.election(service).nominate("c-next") is False
    leaders: EventLog[LeaderChanged] = EventLog("leader")
    contender.election(service).add_listener(leaders)
    leaders.wait_for(lambda event: event.leader_id == "c-frozen", what="the child as leader")
    return contender, child, term, leaders


def _resumed_is_fenced_and_told(child: WorkerProcess, mark: int, bound: float, record: Record) -> str:
    """After SIGCONT: the queued fenced writes all fail with FencedError within the call limit, and the
    child is told (a LeaderChanged away from it, session LOST); the frozen write's report line."""
    _, froze = child.expect("FROZE ", bound, since=mark)
    for line in fenced_lines(child, len(QUEUED), mark, bound):
        _, operation, outcome, seconds = line.split()
        assert outcome == "fenced", (
            f"a stale leader's fenced {operation} ended {outcome}\n{child.stderr_tail()}"
        )
        assert float(seconds) <= CALL_LIMIT, f"a fenced {operation} blocked {seconds}s"
        record(f"stale fenced {operation} -> FencedError", float(seconds))
    _, told = child.expect("LEADER", bound, since=mark)
    assert not told.startswith("LEADER c-frozen "), f"after the freeze the child still reports {told!r}"
    child.expect("STATE LOST", bound, since=mark)
    return froze


@pytest.mark.requires_server
def test_leader_frozen_mid_write_is_replaced(
    consensus_open_session: SessionFactory,
    consensus_spawn_worker: WorkerFactory,
    consensus_ns: str,
    consensus_record: Record,
) -> None:
    """A leader frozen (SIGSTOP) in the middle of a fenced write - on PostgreSQL inside its transaction,
    holding row locks; elsewhere with its request in flight - does not stop the others: within
    session_timeout + the detection delay the other candidate leads with a higher term, its fenced
    writes succeed, and no call of another session blocks longer than request_timeout + 1 s
    (PostgreSQL ends the frozen transaction after ``engine.stall_limit``, releasing its locks).
    Resumed, none of the frozen leader's writes lands after the takeover (the new leader's values
    stay; its queued fenced writes fail with FencedError) and it is told: a LeaderChanged away from
    it, session LOST. No acknowledged write is lost. (Not applicable to SQLite: no server can end a
    stopped process's transaction there; see the next test.)"""
    group, service = unique("ct-group"), unique("ct-service")
    contender, child, term, leaders = _contended(
        consensus_open_session, consensus_spawn_worker, group, service
    )
    keys = {name: f"{consensus_ns}/{name}" for name in ("shared", "owned", "fresh")}
    contender.storage.put(keys["shared"], b"before the freeze")
    bound = loss_bound(contender, SESSION_TIMEOUT)
    mark = len(child.lines)
    with Prober(contender, f"{consensus_ns}/probe", group, service) as prober:
        frozen = _freeze_mid_write(child, "update", keys["shared"])
        try:
            moved = leaders.wait_for(lambda event: event.leader_id == "c-next", bound, what="the hand-over")
            consensus_record("frozen mid-write -> new leader", time.monotonic() - frozen)
            assert moved.term is not None and moved.term > term
            fence = Leadership(service, "c-next", moved.term)
            version, error, seconds = timed_call(
                CALL_LIMIT, lambda: contender.storage.update(keys["shared"], b"new leader", fence=fence)
            )
            assert error is None, error
            consensus_record("new leader's fenced write of the frozen key", seconds)
            stored = {
                keys["shared"]: Versioned(b"new leader", version),
                keys["owned"]: Versioned(b"new leader", contender.storage.put(keys["owned"], b"new leader")),
            }
            for operation, name in QUEUED:  # run the moment the child resumes
                child.send(f"FENCED {operation} {keys[name]}")
        finally:
            child.signal(signal.SIGCONT)
    prober.check()
    froze = _resumed_is_fenced_and_told(child, mark, bound, consensus_record)
    consensus_record("the frozen write, resumed", float(froze.split()[3]), note=froze.split()[2])
    for key, value in stored.items():
        assert contender.storage.fetch(key) == value, f"{key} changed after the takeover ({froze})"
    assert contender.storage.fetch(keys["fresh"]) is None
    for key, value in prober.acked.items():
        assert contender.storage.fetch(key) == value, f"the acknowledged write of {key} was lost"


@pytest.mark.database_file
def test_sqlite_leader_frozen_holding_the_write_lock(
    consensus_open_session: SessionFactory,
    consensus_spawn_worker: WorkerFactory,
    consensus_ns: str,
    consensus_record: Record,
) -> None:
    """A leader frozen (SIGSTOP) inside a fenced write's transaction on SQLite, holding the write lock:
    SQLite cannot take a lock from a stopped process, so while it stays stopped every other write
    fails with OperationTimeoutError within request_timeout + 1 s, and a new session's connect with
    BackendUnavailableError, both naming the process that holds the lock; reads go on; nobody takes
    over (the leadership stays); the other sessions go SUSPENDED, then LOST (their leases cannot be
    renewed). Resumed, the frozen write commits at once - it was decided before anyone else could
    write, so it lands before any takeover - then a leader with a higher term is elected within the
    loss bound, the resumed leader's queued fenced writes fail with FencedError and it is told (a
    LeaderChanged away from it, LOST), every session is writable again, and no acknowledged write is
    lost."""
    group, service = unique("ct-group"), unique("ct-service")
    contender, child, term, _ = _contended(consensus_open_session, consensus_spawn_worker, group, service)
    states: EventLog[tuple[SessionState, float]] = EventLog("state")  # with when it reached the listeners
    contender.add_state_listener(lambda state: states((state, time.monotonic())))
    keys = {name: f"{consensus_ns}/{name}" for name in ("shared", "owned", "fresh")}
    acked = {
        key: Versioned(b"before", contender.storage.put(key, b"before")) for key in list(keys.values())[:2]
    }
    bound = loss_bound(contender, SESSION_TIMEOUT)
    mark = len(child.lines)
    frozen = _freeze_mid_write(child, "update", keys["shared"])
    try:
        _, error, seconds = timed_call(
            CALL_LIMIT, lambda: contender.storage.put(f"{consensus_ns}/blocked", b"x")
        )
        assert isinstance(error, OperationTimeoutError), error
        assert f"held by process {child.pid}" in str(error), error
        consensus_record("a write while frozen -> OperationTimeoutError naming the holder", seconds)
        _, error, seconds = timed_call(CALL_LIMIT, lambda: contender.storage.fetch(keys["owned"]))
        assert error is None
        consensus_record("a read while frozen", seconds)
        _, error, seconds = timed_call(
            CALL_LIMIT, lambda: consensus_open_session(**{**FAULT_OPTIONS, "connect_timeout": 1})
        )
        assert isinstance(error, BackendUnavailableError), error
        assert f"held by process {child.pid}" in str(error), error
        consensus_record("connect while frozen -> BackendUnavailableError naming the holder", seconds)
        for state in (SessionState.SUSPENDED, SessionState.LOST):
            _, arrived = states.wait_for(lambda seen: seen[0] is state, bound, what=state.name)  # noqa: B023
            consensus_record(f"frozen -> others {state.name}", arrived - frozen)
        assert contender.election(service).leadership() == Leadership(service, "c-frozen", term)
        for operation, name in QUEUED:  # run the moment the child resumes
            child.send(f"FENCED {operation} {keys[name]}")
    finally:
        child.signal(signal.SIGCONT)
    resumed = time.monotonic()
    froze = _resumed_is_fenced_and_told(child, mark, bound, consensus_record)
    assert froze.split()[2] == "ok", froze  # decided under the write lock, before anyone could take over
    consensus_record("the frozen write, resumed", float(froze.split()[3]))

    def newer() -> Leadership | None:
        leadership = contender.election(service).leadership()
        return leadership if leadership is not None and leadership.term > term else None

    now = wait_until(newer, bound, what=f"a leader with a term above {term}")
    consensus_record("resume -> a new leader", time.monotonic() - resumed, note=now.leader_id)
    states.wait_last(lambda seen: seen[0] is SessionState.CONNECTED, bound, what="CONNECTED")
    consensus_record("resume -> others CONNECTED", time.monotonic() - resumed)
    wait_until(
        lambda: timed_call(CALL_LIMIT, lambda: contender.storage.put(keys["fresh"], b"after"))[0], bound
    )
    consensus_record("resume -> others writable", time.monotonic() - resumed)
    shared = acked[keys["shared"]]
    assert contender.storage.fetch(keys["shared"]) == Versioned(b"stale leader", shared.version + 1)
    assert contender.storage.fetch(keys["owned"]) == acked[keys["owned"]]
