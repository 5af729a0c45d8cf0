"""The Kafka backend across broker faults: a real single-node KRaft broker of each test's own,
paused (SIGSTOP), SIGKILLed and restarted on its data dir.

The broker keeps a classic group's last completed generation in ``__consumer_offsets`` and restores
its members, with fresh session timers, when it loads the group after a restart: a member removed
since (LeaveGroup, expiry) but before a later generation was written comes back on the broker. The
backend must never report such a member again (docs/decisions.md, "Kafka: departures are recorded
in the command log").
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Iterator

import pytest

import consensus_api as ca
from consensus_testkit import ServerHandle, start_server
from consensus_testkit.conformance.helpers import EventLog, wait_until
from consensus_testkit.conformance.worker import WorkerProcess

LOST, SUSPENDED, CONNECTED = ca.SessionState.LOST, ca.SessionState.SUSPENDED, ca.SessionState.CONNECTED
#: How long reads are watched after a restart: longer than a restored member's fresh session timer.
REVIVAL_WINDOW = 6.0


@pytest.fixture
def fault_server() -> Iterator[ServerHandle]:
    with start_server("kafka") as handle:
        yield handle


def test_paused_broker_suspends_then_reconnects(fault_server: ServerHandle) -> None:
    """A short broker pause: SUSPENDED then CONNECTED, nothing lost, the member still there."""
    url = f"{fault_server.url}/pause"
    with (
        ca.connect(url, session_timeout=8, request_timeout=10) as session,
        ca.connect(url, session_timeout=8) as observer,
    ):
        states: EventLog[ca.SessionState] = EventLog("states")
        session.add_state_listener(states)
        session.group("g").join("m")
        session.storage.put("k", b"v")
        fault_server.pause()
        try:
            states.wait_for(lambda state: state is SUSPENDED, 5)
        finally:
            fault_server.resume()
        states.wait_for(lambda state: state is CONNECTED, 10)
        assert LOST not in states.events
        assert observer.group("g").members() == {"m"}
        assert observer.storage.fetch("k") is not None


def test_broker_restart_loses_the_session_then_rejoins(fault_server: ServerHandle) -> None:
    """A restart longer than the session timeout: LOST (leaders told first), CONNECTED, re-joined;
    the log survives and the old leadership is fenced out."""
    url = f"{fault_server.url}/restart"
    with ca.connect(url, session_timeout=2) as session, ca.connect(url, session_timeout=2) as observer:
        states: EventLog[ca.SessionState] = EventLog("states")
        leaders: EventLog[ca.LeaderChanged] = EventLog("leaders")
        session.add_state_listener(states)
        session.group("g").join("m", b"d")
        assert session.election("s").nominate("c") is True
        old = session.election("s").leadership()
        session.election("s").add_listener(leaders)
        leaders.wait_for(lambda event: event.leader_id == "c")
        version = session.storage.put("k", b"v")
        fault_server.kill()
        time.sleep(3)
        fault_server.restart(90)
        states.wait_for(lambda state: state is LOST, 30)
        states.wait_for(lambda state: state is CONNECTED, 60, since=states.events.index(LOST))
        assert leaders.events.index(ca.LeaderChanged("s", None, None)) > 0
        wait_until(lambda: observer.group("g").membership() == {"m": b"d"}, 30, what="the member re-joined")
        new = wait_until(lambda: observer.election("s").leadership(), 30, what="a leader again")
        assert old is not None and new.leader_id == "c" and new.term > old.term
        with pytest.raises(ca.FencedError):
            session.storage.put("late", b"x", fence=old)
        assert observer.storage.fetch("k") == ca.Versioned(b"v", version)


def test_members_of_a_lost_session_never_come_back_after_broker_restarts(fault_server: ServerHandle) -> None:
    """The chaos run of 2026-11-24: members of a session that went LOST while the broker was down
    (SIGKILL) are gone for good. A crashed process's member (a long session timeout) keeps the group
    from completing the rebalance that would persist their removal, and the broker is restarted again
    at once, so it restores them; no read and no event of an observer may show them after the lost
    session reported CONNECTED. A live session's member (session timeout longer than the outages) stays
    in every view."""
    url = f"{fault_server.url}/revive"
    crashed = WorkerProcess(
        url,
        "hold",
        ["--group", "g", "--member", "crashed", "--service", "s", "--candidate", "c"],
        {"session_timeout": 20},
    )
    try:
        crashed.expect("READY", 60)
        with (
            ca.connect(url, session_timeout=2, auto_rejoin=False) as lost,
            ca.connect(url, session_timeout=40, request_timeout=20) as live,
            ca.connect(url, session_timeout=40, request_timeout=20) as observer,
        ):
            states: EventLog[ca.SessionState] = EventLog("states")
            views: EventLog[ca.MembershipChanged] = EventLog("views")
            lost.add_state_listener(states)
            lost.group("g").join("dead1")
            lost.group("g").join("dead2")
            live.group("g").join("live")
            group = observer.group("g")
            group.add_listener(views)
            everyone = {"dead1", "dead2", "live", "crashed"}
            wait_until(lambda: group.members() == everyone, 30, what="every member seen")
            crashed.signal(signal.SIGKILL)
            reads: list[frozenset[str]] = []
            voided_at = None
            for _ in range(2):  # SIGKILL, then restart (SIGKILL + start) at once, as the nemesis did
                fault_server.kill()
                states.wait_for(lambda state: state is LOST, 30, since=len(states.events))
                since = len(states.events)
                fault_server.restart(90)
                states.wait_for(lambda state: state is CONNECTED, 60, since=since)
                if voided_at is None:
                    voided_at = len(views.events)
                reads += read_for(group, REVIVAL_WINDOW)
            revived = [read for read in reads if read & {"dead1", "dead2"}]
            assert not revived, f"lost members came back in {len(revived)} of {len(reads)} reads"
            shown = [set(view.members) for view in views.events[voided_at:]]
            assert not [view for view in shown if view & {"dead1", "dead2"}], shown
            assert reads and all("live" in read for read in reads), reads
    finally:
        crashed.close()


def read_for(group: ca.GroupMembership, seconds: float) -> list[frozenset[str]]:
    """Every membership ``group`` reads (ten a second) for ``seconds``; failed reads are skipped."""
    reads: list[frozenset[str]] = []
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        with contextlib.suppress(ca.ConsensusError):
            reads.append(group.members())
        time.sleep(0.1)
    return reads
