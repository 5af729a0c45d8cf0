"""Leader election, terms and fenced writes.

Contract: <https://consensus-api.github.io/consensus-api/spec/#7-leaderelection-kip-30-leaderelectionclient>
"""

from __future__ import annotations

import signal

import pytest

from consensus_api import (
    FencedError,
    LeaderChanged,
    Leadership,
    MemberExistsError,
    NotAMemberError,
    Session,
    Versioned,
)
from consensus_testkit.conformance.helpers import EventLog, SessionFactory, loss_timeout, unique, wait_until
from consensus_testkit.conformance.plugin import WorkerFactory


def _queue(open_session: SessionFactory, service: str, count: int = 3) -> tuple[list[Session], list[bool]]:
    """``count`` sessions nominating c0, c1, ... in that order; their sessions and nominate results."""
    sessions = [open_session() for _ in range(count)]
    results = [each.election(service).nominate(f"c{index}") for index, each in enumerate(sessions)]
    return sessions, results


def _current(session: Session, service: str) -> Leadership:
    leadership = session.election(service).leadership()
    assert leadership is not None, f"nobody leads {service}"
    return leadership


def _led_by(session: Session, service: str, leader_id: str) -> Leadership | None:
    current = session.election(service).leadership()
    return current if current is not None and current.leader_id == leader_id else None


def test_first_nominee_leads(consensus_open_session: SessionFactory) -> None:
    """The first of three candidates leads: nominate returns True for it and False for the others."""
    service = unique("ct-service")
    sessions, results = _queue(consensus_open_session, service)
    assert results == [True, False, False]
    for each in sessions:
        assert each.election(service).leader() == "c0"


def test_leadership_reports_service_leader_and_term(consensus_open_session: SessionFactory) -> None:
    """leadership() is Leadership(service, leader_id, term) with an int term, the same in every session."""
    service = unique("ct-service")
    sessions, _ = _queue(consensus_open_session, service)
    leadership = _current(sessions[0], service)
    assert leadership.service == service
    assert leadership.leader_id == "c0"
    assert isinstance(leadership.term, int) and not isinstance(leadership.term, bool)
    assert all(_current(each, service) == leadership for each in sessions)


def test_nobody_leads_without_candidates(consensus_session: Session) -> None:
    """Without candidates leader() and leadership() are None."""
    election = consensus_session.election(unique("ct-service"))
    assert election.leader() is None
    assert election.leadership() is None


def test_resign_hands_over_in_line_with_increasing_terms(consensus_open_session: SessionFactory) -> None:
    """Each resign hands leadership to the next in line, with a strictly higher term, until nobody leads."""
    service = unique("ct-service")
    sessions, _ = _queue(consensus_open_session, service)
    observer = consensus_open_session()
    terms: list[int] = []
    for index, each in enumerate(sessions):
        current = _current(observer, service)
        assert current.leader_id == f"c{index}"
        terms.append(current.term)
        each.election(service).resign(f"c{index}")
    assert terms == sorted(set(terms)), f"terms did not strictly increase: {terms}"
    assert observer.election(service).leadership() is None


def test_listener_sees_every_hand_over(consensus_open_session: SessionFactory) -> None:
    """An election listener gets LeaderChanged for every hand-over, terms rising, then (None, None)."""
    service = unique("ct-service")
    observer = consensus_open_session()
    log: EventLog[LeaderChanged] = EventLog("leader")
    observer.election(service).add_listener(log)
    assert log.wait_count(1)[0] == LeaderChanged(service, None, None)
    sessions, _ = _queue(consensus_open_session, service)
    for index, each in enumerate(sessions):
        expected = f"c{index}"
        log.wait_last(lambda event: event.leader_id == expected, what=f"{expected} leads")  # noqa: B023
        each.election(service).resign(f"c{index}")
    log.wait_last(lambda event: event.leader_id is None, what="nobody leads")
    leaders = [event.leader_id for event in log.events]
    assert leaders == [None, "c0", "c1", "c2", None]
    terms = [event.term for event in log.events[1:-1] if event.term is not None]
    assert len(terms) == 3, log.events
    assert terms == sorted(set(terms)), f"terms did not strictly increase: {terms}"
    assert log.events[-1] == LeaderChanged(service, None, None)


def test_resign_of_follower_keeps_leader(consensus_open_session: SessionFactory) -> None:
    """A follower that resigns leaves the line: leader and term stay, and it is skipped later."""
    service = unique("ct-service")
    sessions, _ = _queue(consensus_open_session, service)
    before = _current(sessions[0], service)
    sessions[1].election(service).resign("c1")
    assert _current(sessions[0], service) == before
    sessions[0].election(service).resign("c0")
    after = _current(sessions[2], service)
    assert after.leader_id == "c2"
    assert after.term > before.term


def test_renominated_candidate_leads_with_higher_term(consensus_session: Session) -> None:
    """A candidate that resigned and nominated again leads under a new, higher term."""
    election = consensus_session.election(unique("ct-service"))
    assert election.nominate("a") is True
    first = election.leadership()
    election.resign("a")
    assert election.nominate("a") is True
    second = election.leadership()
    assert first is not None and second is not None
    assert second.leader_id == "a"
    assert second.term > first.term


def test_closing_leaders_session_hands_over(consensus_open_session: SessionFactory) -> None:
    """Closing the leader's session hands leadership at once to the next candidate, with a higher term."""
    service = unique("ct-service")
    sessions, _ = _queue(consensus_open_session, service, 2)
    observer = consensus_open_session()
    log: EventLog[LeaderChanged] = EventLog("leader")
    observer.election(service).add_listener(log)
    before = log.wait_for(lambda event: event.leader_id == "c0", what="c0 leads")
    sessions[0].close()
    at_once = _current(observer, service)
    assert at_once.leader_id == "c1", "close did not release the candidacy at once"
    after = log.wait_last(lambda event: event.leader_id == "c1", what="c1 takes over")
    assert before.term is not None and after.term is not None and after.term > before.term
    assert at_once == Leadership(service, "c1", after.term)


def test_fenced_writes_with_current_leadership_succeed(consensus_session: Session, consensus_ns: str) -> None:
    """put, update and delete fenced by the current leadership all happen."""
    election = consensus_session.election(unique("ct-service"))
    election.nominate("leader")
    fence = election.leadership()
    assert fence is not None
    created = consensus_session.storage.put(f"{consensus_ns}/k", b"1", fence=fence)
    updated = consensus_session.storage.update(f"{consensus_ns}/k", b"2", version=created, fence=fence)
    assert consensus_session.storage.fetch(f"{consensus_ns}/k") == Versioned(b"2", updated)
    consensus_session.storage.delete(f"{consensus_ns}/k", version=updated, fence=fence)
    assert consensus_session.storage.fetch(f"{consensus_ns}/k") is None


def test_fenced_writes_with_old_leadership_fail(
    consensus_open_session: SessionFactory, consensus_ns: str
) -> None:
    """put, update and delete fenced by a superseded leadership raise FencedError and write nothing."""
    service = unique("ct-service")
    sessions, _ = _queue(consensus_open_session, service, 2)
    old = _current(sessions[0], service)
    version = sessions[0].storage.put(f"{consensus_ns}/existing", b"kept")
    sessions[0].election(service).resign("c0")
    new = _current(sessions[1], service)
    assert new.leader_id == "c1" and new.term > old.term
    storage = sessions[0].storage
    with pytest.raises(FencedError):
        storage.put(f"{consensus_ns}/new", b"x", fence=old)
    with pytest.raises(FencedError):
        storage.update(f"{consensus_ns}/existing", b"x", fence=old)
    with pytest.raises(FencedError):
        storage.delete(f"{consensus_ns}/existing", fence=old)
    assert storage.fetch(f"{consensus_ns}/new") is None
    assert storage.fetch(f"{consensus_ns}/existing") == Versioned(b"kept", version)
    assert sessions[1].storage.put(f"{consensus_ns}/new", b"by c1", fence=new) > 0


def test_fence_without_any_leader_fails(consensus_session: Session, consensus_ns: str) -> None:
    """A write fenced by a leadership whose leader resigned, leaving nobody, raises FencedError."""
    election = consensus_session.election(unique("ct-service"))
    election.nominate("only")
    fence = election.leadership()
    assert fence is not None
    election.resign("only")
    with pytest.raises(FencedError):
        consensus_session.storage.put(f"{consensus_ns}/k", b"x", fence=fence)
    assert consensus_session.storage.fetch(f"{consensus_ns}/k") is None


def test_fence_with_forged_term_fails(consensus_session: Session, consensus_ns: str) -> None:
    """A Leadership with a term that was never issued, another service or another leader id (an
    intruder presenting the current term) fences the write out."""
    service = unique("ct-service")
    election = consensus_session.election(service)
    election.nominate("leader")
    real = election.leadership()
    assert real is not None
    forged = [
        Leadership(service, "leader", real.term + 1_000_000),
        Leadership(unique("ct-other"), "leader", real.term),
        Leadership(service, "intruder", real.term),
    ]
    for fence in forged:
        with pytest.raises(FencedError):
            consensus_session.storage.put(f"{consensus_ns}/k", b"x", fence=fence)
    assert consensus_session.storage.fetch(f"{consensus_ns}/k") is None


def test_duplicate_candidate_raises_member_exists(consensus_open_session: SessionFactory) -> None:
    """Nominating a live candidate id again, from the same or another session, raises MemberExistsError."""
    service = unique("ct-service")
    first, second = consensus_open_session(), consensus_open_session()
    assert first.election(service).nominate("dup") is True
    with pytest.raises(MemberExistsError):
        first.election(service).nominate("dup")
    with pytest.raises(MemberExistsError):
        second.election(service).nominate("dup")
    assert _current(second, service).leader_id == "dup"


def test_resign_of_non_candidate_raises_not_a_member(consensus_open_session: SessionFactory) -> None:
    """resign of an id this session does not hold raises NotAMemberError; another's leader stays."""
    service = unique("ct-service")
    holder, other = consensus_open_session(), consensus_open_session()
    with pytest.raises(NotAMemberError):
        holder.election(service).resign("nobody")
    holder.election(service).nominate("held")
    before = _current(holder, service)
    with pytest.raises(NotAMemberError):
        other.election(service).resign("held")
    assert _current(other, service) == before


def test_listener_first_event_reports_current_leader(consensus_open_session: SessionFactory) -> None:
    """The first LeaderChanged after registration names the current leader and term."""
    service = unique("ct-service")
    sessions, _ = _queue(consensus_open_session, service, 2)
    current = _current(sessions[1], service)
    log: EventLog[LeaderChanged] = EventLog("leader")
    sessions[1].election(service).add_listener(log)
    assert log.wait_count(1)[0] == LeaderChanged(service, current.leader_id, current.term)


def test_killed_leader_hands_over(
    consensus_open_session: SessionFactory, consensus_spawn_worker: WorkerFactory
) -> None:
    """When the leader's process is SIGKILLed, the next candidate leads with a higher term in time."""
    service = unique("ct-service")
    observer = consensus_open_session()
    child = consensus_spawn_worker(
        "hold", "--group", unique("ct-group"), "--member", "m", "--service", service, "--candidate", "doomed"
    )
    _, ready = child.expect("READY", 60)
    assert ready.split()[1] == "leads", ready
    child_term = int(ready.split()[2])
    assert observer.election(service).nominate("heir") is False
    child.signal(signal.SIGKILL)
    bound = loss_timeout(observer.settings.session_timeout)
    heir = wait_until(
        lambda: _led_by(observer, service, "heir"),
        bound,
        what="heir leads",
        observe=lambda: observer.election(service).leadership(),
    )
    assert heir.term > child_term
