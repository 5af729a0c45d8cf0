"""Group membership with ephemeral members.

Contract: <https://consensus-api.github.io/consensus-api/spec/#6-groupmembership-kip-30-groupmembershipclient>
"""

from __future__ import annotations

import signal
from collections.abc import Mapping

import pytest

from consensus_api import MemberExistsError, MembershipChanged, NotAMemberError, Session
from consensus_testkit.conformance.helpers import (
    EventLog,
    SessionFactory,
    is_dispatch_thread,
    loss_timeout,
    quiet_period,
    unique,
)
from consensus_testkit.conformance.plugin import WorkerFactory


def test_join_adds_member_with_data(consensus_session: Session) -> None:
    """join makes the id a member; members() lists it and membership() maps it to its data."""
    group = consensus_session.group(unique("ct-group"))
    group.join("m1", b"data-1")
    group.join("m2")
    assert group.members() == {"m1", "m2"}
    assert isinstance(group.members(), frozenset)
    assert group.membership() == {"m1": b"data-1", "m2": b""}


def test_member_data_is_binary(consensus_session: Session) -> None:
    """Member data of any bytes, including NULs and non-UTF-8, comes back unchanged."""
    group = consensus_session.group(unique("ct-group"))
    data = bytes(range(256))
    group.join("bin", data)
    assert group.membership() == {"bin": data}


def test_leave_removes_member(consensus_session: Session) -> None:
    """leave removes the member; the others stay."""
    group = consensus_session.group(unique("ct-group"))
    group.join("m1")
    group.join("m2")
    group.leave("m1")
    assert group.members() == {"m2"}
    group.leave("m2")
    assert group.membership() == {}


def test_rejoin_after_leave_with_new_data(consensus_session: Session) -> None:
    """An id that left can join again, with new data."""
    group = consensus_session.group(unique("ct-group"))
    group.join("m", b"old")
    group.leave("m")
    group.join("m", b"new")
    assert group.membership() == {"m": b"new"}


def test_duplicate_member_in_same_session_raises(consensus_session: Session) -> None:
    """Joining a live id again from the same session raises MemberExistsError and keeps the data."""
    group = consensus_session.group(unique("ct-group"))
    group.join("m", b"first")
    with pytest.raises(MemberExistsError):
        group.join("m", b"second")
    assert group.membership() == {"m": b"first"}


def test_duplicate_member_from_other_session_raises(consensus_open_session: SessionFactory) -> None:
    """Joining an id that another session holds raises MemberExistsError and keeps the holder."""
    name = unique("ct-group")
    holder, other = consensus_open_session(), consensus_open_session()
    holder.group(name).join("m", b"holder")
    with pytest.raises(MemberExistsError):
        other.group(name).join("m", b"intruder")
    assert other.group(name).membership() == {"m": b"holder"}


def test_leave_of_unknown_id_raises_not_a_member(consensus_session: Session) -> None:
    """leave of an id this session never joined raises NotAMemberError."""
    group = consensus_session.group(unique("ct-group"))
    with pytest.raises(NotAMemberError):
        group.leave("never-joined")
    group.join("m")
    group.leave("m")
    with pytest.raises(NotAMemberError):
        group.leave("m")


def test_leave_of_other_sessions_member_raises(consensus_open_session: SessionFactory) -> None:
    """leave of an id another session holds raises NotAMemberError and the member stays."""
    name = unique("ct-group")
    holder, other = consensus_open_session(), consensus_open_session()
    holder.group(name).join("m")
    with pytest.raises(NotAMemberError):
        other.group(name).leave("m")
    assert holder.group(name).members() == {"m"}


def test_groups_are_independent(consensus_session: Session) -> None:
    """The same member id can live in two groups; leaving one group keeps the other."""
    first, second = consensus_session.group(unique("ct-group")), consensus_session.group(unique("ct-group"))
    first.join("m", b"1")
    second.join("m", b"2")
    first.leave("m")
    assert first.members() == frozenset()
    assert second.membership() == {"m": b"2"}


def test_multi_segment_group_name(consensus_open_session: SessionFactory) -> None:
    """A key-like group name with several segments works like any other, across sessions."""
    name = f"ct/{unique('team')}/workers"
    member, observer = consensus_open_session(), consensus_open_session()
    member.group(name).join("m", b"x")
    assert observer.group(name).membership() == {"m": b"x"}
    assert observer.group(name.rsplit("/", 1)[0]).members() == frozenset()


def test_observer_that_never_joined_sees_members(consensus_open_session: SessionFactory) -> None:
    """A session that never joined sees the same members and data as the members' sessions."""
    name = unique("ct-group")
    first, second, observer = consensus_open_session(), consensus_open_session(), consensus_open_session()
    first.group(name).join("a", b"A")
    second.group(name).join("b", b"B")
    expected = {"a": b"A", "b": b"B"}
    assert observer.group(name).membership() == expected
    assert first.group(name).membership() == expected
    assert second.group(name).membership() == expected


def test_close_releases_member_at_once(consensus_open_session: SessionFactory) -> None:
    """After a member's session closes, an observer's very next read no longer lists it."""
    name = unique("ct-group")
    member, observer = consensus_open_session(), consensus_open_session()
    member.group(name).join("m1")
    member.group(name).join("m2")
    observer.group(name).join("stays")
    assert observer.group(name).members() == {"m1", "m2", "stays"}
    member.close()
    assert observer.group(name).members() == {"stays"}


def test_listener_first_event_is_current_membership(consensus_open_session: SessionFactory) -> None:
    """The first MembershipChanged is the current membership, as a Mapping of id to data."""
    name = unique("ct-group")
    member, observer = consensus_open_session(), consensus_open_session()
    member.group(name).join("m", b"data")
    log: EventLog[MembershipChanged] = EventLog("membership")
    observer.group(name).add_listener(log)
    first = log.wait_count(1)[0]
    assert first.group == name
    assert isinstance(first.members, Mapping)
    assert dict(first.members) == {"m": b"data"}
    assert is_dispatch_thread(log.threads[0])


def test_listener_sees_joins_and_leaves(consensus_open_session: SessionFactory) -> None:
    """A listener in another session sees every join and leave, ending at the current membership."""
    name = unique("ct-group")
    member, observer = consensus_open_session(), consensus_open_session()
    log: EventLog[MembershipChanged] = EventLog("membership")
    observer.group(name).add_listener(log)
    assert dict(log.wait_count(1)[0].members) == {}
    member.group(name).join("a", b"1")
    log.wait_last(lambda event: dict(event.members) == {"a": b"1"}, what="a joined")
    member.group(name).join("b", b"2")
    log.wait_last(lambda event: dict(event.members) == {"a": b"1", "b": b"2"}, what="b joined")
    member.group(name).leave("a")
    log.wait_last(lambda event: dict(event.members) == {"b": b"2"}, what="a left")
    member.close()
    log.wait_last(lambda event: dict(event.members) == {}, what="b released by close")
    assert all(event.group == name for event in log.events)


def test_remove_listener_stops_delivery(consensus_session: Session) -> None:
    """After remove_listener the membership callback gets nothing more."""
    group = consensus_session.group(unique("ct-group"))
    log: EventLog[MembershipChanged] = EventLog("membership")
    group.add_listener(log)
    log.wait_count(1)
    group.remove_listener(log)
    group.join("m")
    quiet_period(lambda: _join_seen(consensus_session))
    assert [dict(event.members) for event in log.events] == [{}]


def _join_seen(session: Session) -> None:
    """The positive control of a negative check: a join in a group of its own reaches a new membership
    listener of ``session``."""
    control = session.group(unique("ct-control"))
    log: EventLog[MembershipChanged] = EventLog("control")
    control.add_listener(log)
    log.wait_count(1)
    control.join("m")
    log.wait_last(lambda event: "m" in event.members, what="the control join")


def test_killed_members_session_leaves_the_group(
    consensus_open_session: SessionFactory, consensus_spawn_worker: WorkerFactory
) -> None:
    """A member whose process is SIGKILLed leaves within session_timeout plus detection, for observers."""
    name, service = unique("ct-group"), unique("ct-service")
    observer = consensus_open_session()
    log: EventLog[MembershipChanged] = EventLog("membership")
    observer.group(name).add_listener(log)
    child = consensus_spawn_worker(
        "hold", "--group", name, "--member", "doomed", "--service", service, "--candidate", "c"
    )
    child.expect("READY", 60)
    log.wait_last(lambda event: "doomed" in event.members, what="the child joined")
    child.signal(signal.SIGKILL)
    bound = loss_timeout(observer.settings.session_timeout)
    log.wait_last(lambda event: "doomed" not in event.members, bound, what="the killed member left")
    assert "doomed" not in observer.group(name).members()
