"""Faults: clients killed and paused, servers killed, paused and restarted, sessions expired by the
server, clients cut off by the network, SQLite files locked and written by killed processes.

Every test states its guarantee in its docstring; the bounds are in ``faults_support``
(``loss_bound``: session_timeout + the backend's detection delay + scheduling slack; calls:
request_timeout + 1 s). Tests marked ``requires_server`` run where the suite controls a server
process (``--consensus-control``), ``database_file`` ones on SQLite only, ``session_expiry`` where
the backend's test profile has a server-side expiry; the rest everywhere.
What they measure is recorded (the ``consensus_record`` fixture) and summarised in docs/guarantees.md.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

import consensus_api
from consensus_api import (
    FencedError,
    LeaderChanged,
    Leadership,
    MembershipChanged,
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
    Subject,
    fenced_lines,
    leading_child,
    led_by,
    loss_bound,
    not_connected,
    recovered,
    survivor_works,
    timed_call,
    watch_child,
)
from consensus_testkit.conformance.helpers import EventLog, SessionFactory, unique, wait_until
from consensus_testkit.conformance.plugin import WorkerFactory
from consensus_testkit.conformance.prober import Prober
from consensus_testkit.faults import expire_session
from consensus_testkit.proxy import ProxyGroup

if TYPE_CHECKING:
    from consensus_testkit import ServerHandle

#: How long a paused server stays paused: past the session timeout and past a call's limit.
PAUSE = max(SESSION_TIMEOUT, CALL_LIMIT) + 0.5


@pytest.fixture
def proxy(consensus_server: ServerHandle) -> Iterator[ProxyGroup]:
    """TCP proxies in front of the tested server (``ServerHandle.fronts``: on the ports Kafka advertises
    for them; on a cluster, node 1's and every node a client through it is sent on to)."""
    with ProxyGroup(consensus_server.fronts) as opened:
        yield opened


@pytest.fixture
def open_proxied(
    proxy: ProxyGroup, consensus_url: str, consensus_options: dict[str, object]
) -> Iterator[SessionFactory]:
    """``open_proxied(**options)``: a session that reaches the server through ``proxy``; closed at the end."""
    sessions: list[Session] = []

    def factory(**options: object) -> Session:
        url = proxy.url_for(consensus_url)
        sessions.append(consensus_api.connect(url, **{**consensus_options, **options}))
        return sessions[-1]

    yield factory
    for opened in reversed(sessions):
        opened.close()


def test_killed_client_is_replaced(
    consensus_open_session: SessionFactory,
    consensus_spawn_worker: WorkerFactory,
    consensus_ns: str,
    consensus_record: Record,
) -> None:
    """A client SIGKILLed while it leads and is a member: within session_timeout plus the backend's
    detection delay, a session that never joined sees the member gone and a new leader with a higher
    term; meanwhile that session's calls work, none blocks longer than request_timeout + 1 s."""
    group, service = unique("ct-group"), unique("ct-service")
    observer, contender = consensus_open_session(**FAULT_OPTIONS), consensus_open_session(**FAULT_OPTIONS)
    child, term = leading_child(consensus_spawn_worker, group, "doomed", service)
    assert contender.election(service).nominate("c-next") is False
    members, leaders = watch_child(observer, group, service, "doomed")
    bound = loss_bound(observer, SESSION_TIMEOUT)

    with Prober(observer, consensus_ns, group, service) as prober:
        killed = prober.fault_begins()
        child.signal(signal.SIGKILL)
        members.wait_last(lambda event: "doomed" not in event.members, bound, what="the killed member gone")
        consensus_record("kill -> member gone", time.monotonic() - killed)
        left = max(0.1, killed + bound - time.monotonic())
        moved = leaders.wait_for(lambda event: event.leader_id == "c-next", left, what="the new leader")
        consensus_record("kill -> new leader", prober.fault_ends() - killed)
        survivor_works(prober, bound)
    assert moved.term is not None and moved.term > term
    assert observer.election(service).leadership() == Leadership(service, "c-next", moved.term)


def test_paused_leader_is_fenced_and_told(
    consensus_open_session: SessionFactory,
    consensus_spawn_worker: WorkerFactory,
    consensus_ns: str,
    consensus_record: Record,
) -> None:
    """A leader SIGSTOPped past its session timeout, then resumed: every fenced write it attempts fails
    with FencedError within request_timeout + 1 s - the first ones at once on resuming, before it can
    have noticed anything - nothing the new leader wrote is overwritten, and it is told: a
    LeaderChanged away from it and session LOST. Meanwhile the new leader's calls work, none blocks
    longer than request_timeout + 1 s."""
    group, service = unique("ct-group"), unique("ct-service")
    contender = consensus_open_session(**FAULT_OPTIONS)
    child, term = leading_child(consensus_spawn_worker, group, "paused", service)
    assert contender.election(service).nominate("c-next") is False
    leaders: EventLog[LeaderChanged] = EventLog("leader")
    contender.election(service).add_listener(leaders)
    leaders.wait_for(lambda event: event.leader_id == "c-paused", what="the child as leader")
    shared, owned, fresh = f"{consensus_ns}/shared", f"{consensus_ns}/owned", f"{consensus_ns}/fresh"
    contender.storage.put(shared, b"before the pause")
    bound = loss_bound(contender, SESSION_TIMEOUT)
    writes = [("update", shared), ("delete", owned), ("put", fresh)]

    with Prober(contender, f"{consensus_ns}/probe", group, service) as prober:
        child.signal(signal.SIGSTOP)
        paused = prober.fault_begins()
        try:
            moved = leaders.wait_for(lambda event: event.leader_id == "c-next", bound, what="the hand-over")
            consensus_record("pause -> new leader", time.monotonic() - paused)
            assert moved.term is not None and moved.term > term
            fence = Leadership(service, "c-next", moved.term)
            storage = contender.storage
            stored = {
                shared: Versioned(b"new leader", storage.update(shared, b"new leader", fence=fence)),
                owned: Versioned(b"new leader", storage.put(owned, b"new leader", fence=fence)),
            }
            mark = len(child.lines)
            for operation, key in writes:  # queued: the child runs them the moment it resumes
                child.send(f"FENCED {operation} {key}")
        finally:
            child.signal(signal.SIGCONT)
        prober.fault_ends()
        survivor_works(prober, bound)

    at_once = fenced_lines(child, len(writes), mark, bound)
    _, told = child.expect("LEADER", bound, since=mark)
    assert not told.startswith("LEADER c-paused "), f"after the pause the child still reports {told!r}"
    lost, _ = child.expect("STATE LOST", bound, since=mark)
    connected, _ = child.expect("STATE CONNECTED", bound, since=lost)
    for operation, key in writes:
        child.send(f"FENCED {operation} {key}")
    later = fenced_lines(child, len(writes), connected, bound)
    for line in at_once + later:
        _, operation, outcome, seconds = line.split()
        assert outcome == "fenced", (
            f"a stale leader's fenced {operation} ended {outcome}: {at_once + later}\n{child.stderr_tail()}"
        )
        assert float(seconds) <= CALL_LIMIT, f"a fenced {operation} blocked {seconds}s"
        consensus_record(f"stale fenced {operation} -> FencedError", float(seconds))
    assert contender.storage.fetch(shared) == stored[shared]
    assert contender.storage.fetch(owned) == stored[owned]
    assert contender.storage.fetch(fresh) is None


@pytest.mark.requires_server
def test_server_killed_and_restarted(
    consensus_server: ServerHandle,
    consensus_open_session: SessionFactory,
    consensus_ns: str,
    consensus_record: Record,
) -> None:
    """The server SIGKILLed and restarted half a session timeout later: the session goes SUSPENDED (or
    LOST), then CONNECTED; no call blocks longer than request_timeout + 1 s meanwhile; no acknowledged
    write is lost; listeners converge to the stored state; member and leadership are back (re-joined,
    with a higher term, if the session was LOST)."""
    subject = Subject(consensus_open_session(**FAULT_OPTIONS), consensus_ns)
    bound = loss_bound(subject.session, SESSION_TIMEOUT)
    mark = len(subject.states)
    with subject.probe() as prober:
        killed = prober.fault_begins()
        consensus_server.kill()
        time.sleep(max(0.0, killed + SESSION_TIMEOUT / 2 - time.monotonic()))
        restarting = time.monotonic()
        consensus_server.restart()
        ready = prober.fault_ends()
        consensus_record("server restart", ready - restarting)
        subject.states.wait_for(not_connected, bound, since=mark, what="SUSPENDED or LOST")
        consensus_record("kill -> SUSPENDED/LOST seen by listeners", subject.noticed(killed) or 0.0)
        subject.states.wait_last(lambda state: state is SessionState.CONNECTED, bound, what="CONNECTED")
        consensus_record("server ready -> session CONNECTED", time.monotonic() - ready)
        recovered(subject, prober, bound, consensus_record)


@pytest.mark.requires_server
def test_server_paused_and_resumed(
    consensus_server: ServerHandle,
    consensus_open_session: SessionFactory,
    consensus_ns: str,
    consensus_record: Record,
) -> None:
    """The server SIGSTOPped past the session timeout and past a call's limit, then resumed: the session
    goes SUSPENDED, then CONNECTED or LOST-then-CONNECTED; no call blocks longer than request_timeout
    + 1 s meanwhile; no acknowledged write is lost; listeners converge; member and leadership are back."""
    subject = Subject(consensus_open_session(**FAULT_OPTIONS), consensus_ns)
    bound = loss_bound(subject.session, SESSION_TIMEOUT)
    with subject.probe() as prober:
        paused = prober.fault_begins()
        consensus_server.pause()
        try:
            subject.states.wait_for(not_connected, bound, what="SUSPENDED or LOST")
            consensus_record("pause -> SUSPENDED/LOST seen by listeners", time.monotonic() - paused)
            time.sleep(max(0.0, paused + PAUSE - time.monotonic()))
        finally:
            consensus_server.resume()
        resumed = prober.fault_ends()
        subject.states.wait_last(lambda state: state is SessionState.CONNECTED, bound, what="CONNECTED")
        consensus_record("resume -> session CONNECTED", time.monotonic() - resumed)
        recovered(subject, prober, bound, consensus_record)


@pytest.mark.session_expiry
def test_server_side_session_expiry(
    consensus_open_session: SessionFactory, consensus_ns: str, consensus_record: Record
) -> None:
    """The server ends the session (ZooKeeper: closed by a duplicate client; etcd: lease revoked; SQL:
    lease row expired; Kafka: members removed from their groups): its candidacy is gone - the other
    candidate leads with a higher term - the session goes LOST, then CONNECTED, re-joins its member and
    candidacy (auto_rejoin), and its listeners converge to the stored state."""
    subject = Subject(consensus_open_session(**FAULT_OPTIONS), consensus_ns)
    other = consensus_open_session(**FAULT_OPTIONS)
    assert other.election(subject.service).nominate("c-other") is False
    leaders: EventLog[LeaderChanged] = EventLog("other's leader")
    other.election(subject.service).add_listener(leaders)
    bound = loss_bound(other, SESSION_TIMEOUT)
    with subject.probe() as prober:
        expired = prober.fault_begins()
        expire_session(subject.session)
        moved = leaders.wait_for(lambda event: event.leader_id == "c-other", bound, what="the other leading")
        consensus_record("expiry -> other candidate leads", time.monotonic() - expired)
        assert moved.term is not None and moved.term > subject.term
        subject.states.wait_for(lambda state: state is SessionState.LOST, bound, what="LOST")
        consensus_record("expiry -> session LOST", time.monotonic() - expired)
        subject.states.wait_last(lambda state: state is SessionState.CONNECTED, bound, what="CONNECTED")
        consensus_record("expiry -> session CONNECTED", prober.fault_ends() - expired)
        subject.leaders.wait_last(lambda event: event.leader_id == "c-other", bound, what="told who leads")
        other.election(subject.service).resign("c-other")  # the re-joined candidacy takes over
        recovered(subject, prober, bound, consensus_record)


@pytest.mark.requires_server
def test_client_cut_off_from_running_server(
    proxy: ProxyGroup,
    open_proxied: SessionFactory,
    consensus_open_session: SessionFactory,
    consensus_ns: str,
    consensus_record: Record,
) -> None:
    """A client cut off from a running server (a partition: its TCP proxy stops forwarding) for longer
    than its session timeout: a session that never joined sees its member gone and the other candidate
    lead with a higher term; the client goes SUSPENDED, then LOST, and is told it no longer leads,
    all before the partition heals; no call blocks longer than request_timeout + 1 s; healed, it is
    CONNECTED again and re-joins, its stale fenced writes fail with FencedError, and nothing the new
    leader wrote is overwritten."""
    subject = Subject(open_proxied(**FAULT_OPTIONS), consensus_ns)
    other = consensus_open_session(**FAULT_OPTIONS)
    assert other.election(subject.service).nominate("c-other") is False
    members: EventLog[MembershipChanged] = EventLog("other's members")
    other.group(subject.group).add_listener(members)
    members.wait_for(lambda event: "m" in event.members, what="the subject as member")
    bound = loss_bound(other, SESSION_TIMEOUT)
    told_mark = len(subject.leaders)
    with subject.probe() as prober:
        cut = prober.fault_begins()
        proxy.stall()
        try:
            members.wait_last(lambda event: "m" not in event.members, bound, what="the cut-off member gone")
            consensus_record("cut -> member gone for others", time.monotonic() - cut)
            fence = wait_until(lambda: led_by(other, subject.service, "c-other"), bound, what="hand-over")
            assert fence.term > subject.term, fence
            subject.states.wait_for(
                lambda state: state is SessionState.LOST, bound, what="LOST while cut off"
            )
            consensus_record("cut -> client LOST", time.monotonic() - cut)
            subject.leaders.wait_for(lambda event: event.leader_id != "c", bound, since=told_mark)
        finally:
            proxy.heal()
        healed = prober.fault_ends()
        subject.states.wait_last(lambda state: state is SessionState.CONNECTED, bound, what="CONNECTED")
        consensus_record("heal -> client CONNECTED", time.monotonic() - healed)
        owned = f"{consensus_ns}/owned"
        written = other.storage.put(owned, b"new leader", fence=fence)
        stale = subject.session.storage
        _, error, seconds = timed_call(CALL_LIMIT, lambda: stale.update(owned, b"x", fence=subject.held))
        assert isinstance(error, FencedError), error
        consensus_record("stale fenced update -> FencedError", seconds)
        assert other.storage.fetch(owned) == Versioned(b"new leader", written)
        other.election(subject.service).resign("c-other")
        recovered(subject, prober, bound, consensus_record)


@pytest.mark.requires_server
def test_connections_reset_briefly(
    proxy: ProxyGroup, open_proxied: SessionFactory, consensus_ns: str, consensus_record: Record
) -> None:
    """Every connection of a client reset and new ones refused for half a second (far less than the
    session timeout): the session rides it out - never LOST, CONNECTED again with its member and the
    same term - no call blocks longer than request_timeout + 1 s, no acknowledged write is lost and
    listeners converge."""
    subject = Subject(open_proxied(**FAULT_OPTIONS), consensus_ns)
    bound = loss_bound(subject.session, SESSION_TIMEOUT)
    with subject.probe() as prober:
        prober.fault_begins()
        proxy.drop()
        time.sleep(0.5)
        proxy.heal()
        prober.fault_ends()
        wait_until(
            lambda: timed_call(CALL_LIMIT, lambda: subject.session.storage.keys(consensus_ns))[0], bound
        )
        recovered(subject, prober, bound, consensus_record)
    assert not subject.lost(), f"a 0.5 s connection reset lost the session: {subject.states.events}"


@pytest.mark.database_file
def test_sqlite_writer_killed_mid_transaction(
    consensus_open_session: SessionFactory,
    consensus_spawn_worker: WorkerFactory,
    consensus_ns: str,
    consensus_record: Record,
) -> None:
    """A process SIGKILLed while it holds SQLite's write lock with every row of every table deleted
    (uncommitted): nothing acknowledged is lost, calls meanwhile end within request_timeout + 1 s,
    and the database is writable again at once."""
    subject = Subject(consensus_open_session(**FAULT_OPTIONS), consensus_ns)
    child = consensus_spawn_worker("sqlite-lock", "--hold", "60", "--wipe")
    child.expect("READY", 30)
    bound = loss_bound(subject.session, SESSION_TIMEOUT)
    with subject.probe() as prober:
        prober.fault_begins()  # the lock is held from READY on
        time.sleep(1.0)
        child.signal(signal.SIGKILL)
        killed = prober.fault_ends()
        wait_until(
            lambda: timed_call(CALL_LIMIT, lambda: subject.session.storage.put(f"{consensus_ns}/k", b"k"))[0],
            bound,
        )
        consensus_record("kill -> database writable", time.monotonic() - killed)
        recovered(subject, prober, bound, consensus_record)


@pytest.mark.database_file
def test_sqlite_locked_longer_than_request_timeout(
    consensus_open_session: SessionFactory,
    consensus_spawn_worker: WorkerFactory,
    consensus_ns: str,
    consensus_record: Record,
) -> None:
    """Another process holds SQLite's write lock for longer than request_timeout: a write raises
    OperationTimeoutError after request_timeout (at most 1 s more) and did not happen, reads keep
    working, nothing acknowledged is lost, and once the lock is gone database and session are usable
    again (the session re-joins if its lease lapsed meanwhile)."""
    subject = Subject(consensus_open_session(**FAULT_OPTIONS), consensus_ns)
    hold = CALL_LIMIT + 1
    child = consensus_spawn_worker("sqlite-lock", "--hold", str(hold))
    child.expect("READY", 30)
    bound = loss_bound(subject.session, SESSION_TIMEOUT)
    with subject.probe() as prober:
        prober.fault_begins()  # the lock is held from READY on
        _, error, seconds = timed_call(
            CALL_LIMIT, lambda: subject.session.storage.put(f"{consensus_ns}/blocked", b"x")
        )
        assert isinstance(error, OperationTimeoutError), error
        consensus_record("locked write -> OperationTimeoutError", seconds)
        key, stored = next(iter(subject.acked.items()))
        result, error, seconds = timed_call(CALL_LIMIT, lambda: subject.session.storage.fetch(key))
        assert error is None and result == stored, (result, error)
        consensus_record("read while locked", seconds)
        child.expect("DONE", hold + 10)
        prober.fault_ends()
        assert subject.session.storage.fetch(f"{consensus_ns}/blocked") is None
        recovered(subject, prober, bound, consensus_record)
