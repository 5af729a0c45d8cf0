"""Sessions, their states, and loss and re-join of ephemeral state.

Contract: <https://consensus-api.github.io/consensus-api/spec/#3-session>
"""

from __future__ import annotations

import signal
from collections.abc import Callable

import pytest

from consensus_api import (
    LeaderChanged,
    Leadership,
    MembershipChanged,
    Session,
    SessionLostError,
    SessionState,
)
from consensus_testkit.conformance.helpers import (
    EventLog,
    SessionFactory,
    is_dispatch_thread,
    loss_timeout,
    unique,
    wait_until,
)
from consensus_testkit.conformance.plugin import WorkerFactory


def test_state_is_connected_after_connect(consensus_session: Session) -> None:
    """A freshly connected session is CONNECTED."""
    assert consensus_session.state is SessionState.CONNECTED


def test_backend_name_is_reported(consensus_session: Session) -> None:
    """session.backend is a non-empty, lower-case name."""
    assert isinstance(consensus_session.backend, str)
    assert consensus_session.backend
    assert consensus_session.backend == consensus_session.backend.strip().lower()


def test_close_sets_closed_and_tells_state_listeners(consensus_open_session: SessionFactory) -> None:
    """close() makes the state CLOSED and state listeners get CLOSED on the dispatcher thread."""
    session = consensus_open_session()
    log: EventLog[SessionState] = EventLog("state")
    session.add_state_listener(log)
    session.close()
    assert session.state is SessionState.CLOSED
    log.wait_for(lambda state: state is SessionState.CLOSED, what="CLOSED")
    assert all(is_dispatch_thread(name) for name in log.threads), log.threads


def test_close_is_idempotent(consensus_open_session: SessionFactory) -> None:
    """A second close() is a no-op and the state stays CLOSED."""
    session = consensus_open_session()
    session.close()
    session.close()
    assert session.state is SessionState.CLOSED


def test_context_manager_closes_session(consensus_open_session: SessionFactory, consensus_ns: str) -> None:
    """Leaving a with-block closes the session, also when the block raises."""
    with consensus_open_session() as session:
        session.storage.put(f"{consensus_ns}/k", b"v")
        inside = session.state
    assert inside is SessionState.CONNECTED
    assert session.state is SessionState.CLOSED
    failing = consensus_open_session()
    with pytest.raises(RuntimeError), failing:
        raise RuntimeError("raised on purpose inside the with-block")
    assert failing.state is SessionState.CLOSED


def _calls_after_close(session: Session, ns: str) -> dict[str, Callable[[], object]]:
    group, election = session.group(unique("ct-group")), session.election(unique("ct-service"))
    return {
        "fetch": lambda: session.storage.fetch(f"{ns}/k"),
        "put": lambda: session.storage.put(f"{ns}/k", b"v"),
        "update": lambda: session.storage.update(f"{ns}/k", b"v"),
        "delete": lambda: session.storage.delete(f"{ns}/k"),
        "keys": lambda: session.storage.keys(ns),
        "join": lambda: group.join("m"),
        "leave": lambda: group.leave("m"),
        "members": group.members,
        "membership": group.membership,
        "nominate": lambda: election.nominate("c"),
        "resign": lambda: election.resign("c"),
        "leader": election.leader,
        "leadership": election.leadership,
    }


def test_calls_after_close_raise_session_lost(
    consensus_open_session: SessionFactory, consensus_ns: str
) -> None:
    """Every storage, membership and election call on a closed session raises SessionLostError."""
    session = consensus_open_session()
    session.storage.put(f"{consensus_ns}/k", b"v")
    session.close()
    for name, call in _calls_after_close(session, consensus_ns).items():
        with pytest.raises(SessionLostError):
            call()
            pytest.fail(f"{name}() on a closed session did not raise")


def test_closing_one_session_leaves_others_working(
    consensus_open_session: SessionFactory, consensus_ns: str
) -> None:
    """Closing one session does not disturb another session of the same backend."""
    first, second = consensus_open_session(), consensus_open_session()
    name = unique("ct-group")
    second.group(name).join("m")
    first.close()
    assert second.state is SessionState.CONNECTED
    assert second.storage.put(f"{consensus_ns}/k", b"v") > 0
    assert second.group(name).members() == {"m"}


def test_repr_names_backend_and_state_without_password(
    consensus_session: Session, consensus_url: str
) -> None:
    """repr(session) shows the URL's scheme and the state, and never the password."""
    text = repr(consensus_session)
    assert consensus_session.url.scheme in text
    assert "CONNECTED" in text
    if consensus_session.url.password:
        assert consensus_session.url.password not in text
        assert consensus_session.url.password not in str(consensus_session.url)


def test_paused_member_is_dropped_then_rejoins(
    consensus_open_session: SessionFactory, consensus_spawn_worker: WorkerFactory, consensus_ns: str
) -> None:
    """A SIGSTOPped leader is dropped for observers; resumed, it is told, goes LOST, re-joins, is fenced."""
    group, service = unique("ct-group"), unique("ct-service")
    observer = consensus_open_session()
    child = consensus_spawn_worker(
        "hold", "--group", group, "--member", "paused", "--service", service, "--candidate", "c-child"
    )
    _, ready = child.expect("READY", 60)
    assert ready.split()[1] == "leads", ready
    child_term = int(ready.split()[2])
    assert observer.election(service).nominate("c-observer") is False
    members: EventLog[MembershipChanged] = EventLog("membership")
    leaders: EventLog[LeaderChanged] = EventLog("leader")
    observer.group(group).add_listener(members)
    observer.election(service).add_listener(leaders)
    members.wait_for(lambda event: "paused" in event.members, what="the child as member")
    leaders.wait_for(lambda event: event.leader_id == "c-child", what="the child as leader")
    bound = loss_timeout(observer.settings.session_timeout)

    child.signal(signal.SIGSTOP)
    try:
        members.wait_last(lambda event: "paused" not in event.members, bound, what="the paused member gone")
        moved = leaders.wait_for(lambda event: event.leader_id == "c-observer", bound, what="hand-over")
        assert moved.term is not None and moved.term > child_term
        assert observer.election(service).leadership() == Leadership(service, "c-observer", moved.term)
        mark = len(child.lines)
    finally:
        child.signal(signal.SIGCONT)

    # The child must learn it no longer leads before it is CONNECTED again: by LeaderChanged(None) when
    # the loss is reported first, or by the new leader's LeaderChanged when a watch fires first
    # (<https://consensus-api.github.io/consensus-api/spec/#7-leaderelection-kip-30-leaderelectionclient>).
    told, line = child.expect("LEADER", bound, since=mark)
    assert not line.startswith("LEADER c-child "), f"after the loss the child still reports {line!r}"
    lost, _ = child.expect("STATE LOST", bound, since=mark)
    connected, _ = child.expect("STATE CONNECTED", bound, since=lost)
    assert told < connected, child.lines.events
    members.wait_last(lambda event: "paused" in event.members, bound, what="the child re-joined")
    assert observer.election(service).leadership() == Leadership(service, "c-observer", moved.term)
    child.send(f"FENCED_PUT {consensus_ns}/fenced")
    _, result = child.expect("FENCED_PUT", bound)
    assert result == "FENCED_PUT fenced"
    assert observer.storage.fetch(f"{consensus_ns}/fenced") is None
    child.send("EXIT")
    child.expect("BYE", bound)
    wait_until(lambda: "paused" not in observer.group(group).members(), bound, what="the child left on close")
