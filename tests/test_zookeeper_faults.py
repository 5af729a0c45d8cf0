"""The ZooKeeper backend under real faults: server-side session expiry, restarts, outages longer
than the session, a paused server, calls during an outage, an unreachable server."""

from __future__ import annotations

import threading
import time

import pytest
from zookeeper_support import Connect, kazoo_of, state_log, zk_session_id

import consensus_api as ca
from consensus_api import (
    FencedError,
    LeaderChanged,
    MembershipChanged,
    OperationTimeoutError,
    SessionState,
    ValueChanged,
)
from consensus_backends.zookeeper.testkit.profile import expire_zookeeper_session
from consensus_testkit import ServerHandle
from consensus_testkit.conformance.helpers import EventLog, wait_until
from consensus_testkit.host import HOST, free_port


def test_real_session_expiry_reports_lost_then_rejoins(zk_server: ServerHandle, zk_connect: Connect) -> None:
    """A server-side expiry: LOST then CONNECTED, the old leader is told first, members are re-joined,
    listeners converge and the old leadership is fenced."""
    victim, observer = zk_connect(zk_server), zk_connect(zk_server)
    states = state_log(victim)
    victim.group("g").join("victim", b"v")
    assert victim.election("e").nominate("a") is True
    old = victim.election("e").leadership()
    assert old is not None
    assert observer.election("e").nominate("b") is False
    leaders: EventLog[LeaderChanged] = EventLog("leader")
    values: EventLog[ValueChanged] = EventLog("value")
    victim.election("e").add_listener(leaders)
    victim.listeners.add_value_listener("shared", values)
    leaders.wait_for(lambda event: event.leader_id == "a")
    values.wait_count(1)
    mark, old_session = len(leaders), zk_session_id(victim)

    session_id, password = kazoo_of(victim).client_id
    expire_zookeeper_session(f"{HOST}:{zk_server.port}", session_id, password)
    lost = states.wait_index(lambda state: state is SessionState.LOST, what="LOST")
    states.wait_index(lambda state: state is SessionState.CONNECTED, since=lost, what="CONNECTED")
    assert zk_session_id(victim) != old_session
    assert leaders.wait_count(mark + 1)[mark] == LeaderChanged("e", None, None)

    version = observer.storage.put("shared", b"after")
    values.wait_last(lambda event: event == ValueChanged("shared", b"after", version), what="convergence")
    wait_until(lambda: observer.group("g").membership() == {"victim": b"v"}, what="the victim re-joined")
    current = leaders.wait_last(lambda event: event.leader_id == "b", what="b leads")
    assert current.term is not None and current.term > old.term
    with pytest.raises(FencedError):
        victim.storage.put("fenced", b"x", fence=old)
    assert observer.storage.fetch("fenced") is None


def test_server_restart_keeps_the_session(zk_own_server: ServerHandle, zk_connect: Connect) -> None:
    """kill + restart within session_timeout: SUSPENDED then CONNECTED on the same session, ephemerals
    kept, and watches re-armed so that listeners converge."""
    watcher = zk_connect(zk_own_server, session_timeout=20, request_timeout=4)
    states = state_log(watcher)
    watcher.group("g").join("m", b"kept")
    session_id = zk_session_id(watcher)
    values: EventLog[ValueChanged] = EventLog("value")
    members: EventLog[MembershipChanged] = EventLog("members")
    watcher.listeners.add_value_listener("k", values)
    watcher.group("g").add_listener(members)
    values.wait_count(1)
    members.wait_count(1)

    zk_own_server.kill()
    suspended = states.wait_index(lambda state: state is SessionState.SUSPENDED, what="SUSPENDED")
    zk_own_server.restart()
    states.wait_index(lambda state: state is SessionState.CONNECTED, since=suspended, what="CONNECTED")
    assert SessionState.LOST not in states.events
    assert zk_session_id(watcher) == session_id

    writer = zk_connect(zk_own_server)
    version = writer.storage.put("k", b"after restart")
    writer.group("g").join("w", b"writer")
    values.wait_last(lambda event: event == ValueChanged("k", b"after restart", version), what="value")
    members.wait_last(lambda event: dict(event.members) == {"m": b"kept", "w": b"writer"}, what="members")


def test_long_outage_presumes_the_session_lost(zk_own_server: ServerHandle, zk_connect: Connect) -> None:
    """Disconnected longer than session_timeout: LOST is reported during the outage; when the server
    comes back and resumes the old session, it is closed and a new one re-joins everything."""
    session = zk_connect(zk_own_server, session_timeout=2, request_timeout=5)
    states = state_log(session)
    session.group("g").join("m", b"x")
    assert session.election("e").nominate("c") is True
    old = session.election("e").leadership()
    old_session = zk_session_id(session)
    leaders: EventLog[LeaderChanged] = EventLog("leader")
    session.election("e").add_listener(leaders)
    leaders.wait_for(lambda event: event.leader_id == "c")
    mark = len(leaders)

    zk_own_server.kill()
    lost = states.wait_index(lambda state: state is SessionState.LOST, 10, what="LOST while down")
    assert leaders.wait_count(mark + 1)[mark] == LeaderChanged("e", None, None)
    zk_own_server.restart()
    states.wait_index(lambda state: state is SessionState.CONNECTED, since=lost, what="CONNECTED")
    assert zk_session_id(session) != old_session
    current = leaders.wait_last(lambda event: event.leader_id == "c", what="c leads again")
    assert old is not None and current.term is not None and current.term > old.term
    assert session.group("g").membership() == {"m": b"x"}
    with pytest.raises(FencedError):
        session.storage.put("fenced", b"x", fence=old)


def test_paused_server_reports_lost_then_recovers(zk_own_server: ServerHandle, zk_connect: Connect) -> None:
    """A frozen server: SUSPENDED, then LOST after session_timeout; after SIGCONT a new session re-joins."""
    session = zk_connect(zk_own_server, session_timeout=2, request_timeout=5)
    states = state_log(session)
    session.group("g").join("m", b"x")
    zk_own_server.pause()
    try:
        suspended = states.wait_index(lambda state: state is SessionState.SUSPENDED, 10, what="SUSPENDED")
        lost = states.wait_index(lambda state: state is SessionState.LOST, 10, since=suspended, what="LOST")
    finally:
        zk_own_server.resume()
    states.wait_index(lambda state: state is SessionState.CONNECTED, since=lost, what="CONNECTED")
    wait_until(lambda: session.group("g").membership() == {"m": b"x"}, what="the member re-joined")


#: Over the configured timeout, for a bounded call or connect to end on a loaded 2-core machine: the
#: contract's 1 s plus scheduling slack. The latencies themselves: benchmarks/detection.py.
TIMING_SLACK = 3.0


def test_calls_during_an_outage_are_bounded(zk_own_server: ServerHandle, zk_connect: Connect) -> None:
    """With the server down, reads and writes raise OperationTimeoutError within request_timeout
    (plus a margin), and close() returns promptly."""
    request_timeout = 2.0
    session = zk_connect(zk_own_server, session_timeout=10, request_timeout=request_timeout)
    session.storage.put("k", b"v")
    zk_own_server.kill()
    for call in (lambda: session.storage.fetch("k"), lambda: session.storage.update("k", b"w")):
        started = time.monotonic()
        with pytest.raises(OperationTimeoutError):
            call()
        assert time.monotonic() - started < request_timeout + TIMING_SLACK
    started = time.monotonic()
    session.close()
    assert time.monotonic() - started < request_timeout + TIMING_SLACK


def test_unreachable_server_leaves_no_threads() -> None:
    """open() against a closed port fails within connect_timeout and kazoo's threads end."""
    before = set(threading.enumerate())
    started = time.monotonic()
    with pytest.raises(ca.BackendUnavailableError):
        ca.connect(f"zookeeper://{HOST}:{free_port()}/x", connect_timeout=1.5, session_timeout=2)
    assert time.monotonic() - started < 1.5 + TIMING_SLACK
    wait_until(
        lambda: not [t for t in set(threading.enumerate()) - before if t.is_alive()],
        what="kazoo's threads ended",
        observe=lambda: set(threading.enumerate()) - before,
    )
