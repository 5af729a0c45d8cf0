"""The Kafka backend's group membership and election on the real group protocol of a Kafka 4.x
KRaft broker: dead sessions, SIGKILLed processes, hand-over, departures and the re-reads they cause.

A crash is a real one: a child process holding the session (``conformance.worker hold``) is SIGKILLed.
Storage, connection and credentials: tests/test_kafka_backend.py.
"""

from __future__ import annotations

import signal
import threading
import time
from collections import Counter
from typing import Any

import pytest
from kafka_support import SESSION_TIMEOUT, Connect, Holder, race

import consensus_api as ca
from consensus_api.backend import Target, TargetKind
from consensus_api.config import build_options, parse_url
from consensus_backends.kafka import KafkaBackend
from consensus_backends.kafka.client import Channel
from consensus_backends.kafka.groups import Groups
from consensus_testkit.conformance.helpers import EventLog, wait_until

#: How late a dead session's member may leave: session timeout, one rebalance, the observer's poll.
DEPARTURE_SLACK = 2.0


def test_killed_members_session_leaves_for_an_observer_that_never_joined(
    kafka_connect: Connect, kafka_holder: Holder
) -> None:
    """A member and candidate in a SIGKILLed child process are gone, for an observer that never joined,
    once the session timed out (no LeaveGroup: not earlier) and within the bound."""
    observer = kafka_connect()
    child = kafka_holder("workers", "w1", "svc", "c")
    assert observer.group("workers").membership() == {"w1": b"child"}
    child.signal(signal.SIGKILL)
    killed = time.monotonic()
    bound = SESSION_TIMEOUT + DEPARTURE_SLACK
    wait_until(lambda: "w1" not in observer.group("workers").members(), bound, what="the killed member gone")
    assert time.monotonic() - killed >= SESSION_TIMEOUT * 0.8  # it was the session timeout, not a leave
    wait_until(lambda: observer.election("svc").leadership() is None, bound, what="its candidacy gone")


def test_close_leaves_at_once(kafka_connect: Connect) -> None:
    """close() sends LeaveGroup: member and candidacy are gone for others as it returns, well before the
    session timeout would have removed them."""
    member, observer = kafka_connect(), kafka_connect()
    member.group("g").join("m")
    member.election("s").nominate("m")
    started = time.monotonic()
    member.close()
    assert observer.group("g").members() == frozenset()
    assert observer.election("s").leadership() is None
    assert time.monotonic() - started < SESSION_TIMEOUT


def test_killed_leader_hands_over_with_a_higher_term(kafka_connect: Connect, kafka_holder: Holder) -> None:
    """The leader's process SIGKILLed: the next candidate takes over after the session timeout with a
    higher term; listeners see it."""
    heir, observer = kafka_connect(), kafka_connect()
    leader = kafka_holder("g", "m", "svc", "a")
    assert heir.election("svc").nominate("b") is False
    before = observer.election("svc").leadership()
    assert before is not None and before.leader_id == "a"
    log: EventLog[ca.LeaderChanged] = EventLog("leader")
    observer.election("svc").add_listener(log)
    log.wait_for(lambda event: event.leader_id == "a")
    leader.signal(signal.SIGKILL)
    after = log.wait_last(lambda event: event.leader_id == "b", SESSION_TIMEOUT + DEPARTURE_SLACK)
    assert after.term is not None and after.term > before.term
    assert [event.leader_id for event in log.events] == ["a", "b"]


def test_leader_stays_while_candidates_come_and_go(kafka_connect: Connect, kafka_holder: Holder) -> None:
    """Sticky: joins and departures of followers - a resignation, a SIGKILLed process - change neither
    the leader nor its term. The killed follower's member (same session) leaving shows its session is
    gone; the check waits for that, then ``DEPARTURE_SLACK`` for the election's own rebalance."""
    leader, observer = kafka_connect(), kafka_connect()
    assert leader.election("svc").nominate("a") is True
    first = leader.election("svc").leadership()
    log: EventLog[ca.LeaderChanged] = EventLog("leader")
    observer.election("svc").add_listener(log)
    log.wait_for(lambda event: event.leader_id == "a")
    doomed = kafka_holder("g", "f0", "svc", "f0")
    followers = [kafka_connect() for _ in range(2)]
    for index, follower in enumerate(followers, start=1):
        assert follower.election("svc").nominate(f"f{index}") is False
    followers[0].election("svc").resign("f1")
    doomed.signal(signal.SIGKILL)
    wait_until(
        lambda: "f0" not in observer.group("g").members(),
        SESSION_TIMEOUT + DEPARTURE_SLACK,
        what="the killed follower's session gone",
    )
    time.sleep(DEPARTURE_SLACK)
    assert kafka_connect().election("svc").nominate("f3") is False
    assert observer.election("svc").leadership() == first
    assert first is not None and log.events == [ca.LeaderChanged("svc", "a", first.term)]


def test_racing_duplicate_joins_leave_one_member(kafka_connect: Connect) -> None:
    """Four sessions join one id at once: the group leader accepts one, the others get MemberExistsError."""
    sessions = [kafka_connect() for _ in range(4)]
    results = race(
        *(lambda s=s, i=i: s.group("g").join("same", str(i).encode()) for i, s in enumerate(sessions))
    )
    winners = [index for index, result in enumerate(results) if result is None]
    assert len(winners) == 1, results
    assert all(isinstance(result, ca.MemberExistsError) for result in results if result is not None)
    assert sessions[0].group("g").membership() == {"same": str(winners[0]).encode()}


def test_members_of_one_session_share_a_kafka_member(kafka_connect: Connect) -> None:
    """Three members joined by one session are one Kafka group member; leaving the middle one hides it
    from an observer at once while the others stay; another session's duplicate of a shared id is
    rejected by the group leader; the last leave takes the Kafka member out of the group."""
    joiner, rival, observer = kafka_connect(), kafka_connect(), kafka_connect()
    group = joiner.group("g")
    for index in range(3):
        group.join(f"m{index}", b"%d" % index)
    kafka_members = joiner._backend.fault_identity()["members"]
    assert isinstance(kafka_members, list) and len(kafka_members) == 1
    rival.group("g").join("other")
    with pytest.raises(ca.MemberExistsError):
        rival.group("g").join("m1")
    assert observer.group("g").membership() == {"m0": b"0", "m1": b"1", "m2": b"2", "other": b""}
    group.leave("m1")
    assert observer.group("g").members() == {"m0", "m2", "other"}
    group.join("m1", b"again")
    assert observer.group("g").membership()["m1"] == b"again"
    for member in ("m0", "m1", "m2"):
        group.leave(member)
    assert joiner._backend.fault_identity()["members"] == []
    assert observer.group("g").members() == {"other"}


class _Hints:
    """The ``BackendEvents`` of a bare backend: records each target reported changed."""

    def __init__(self) -> None:
        self.targets: list[Target] = []

    def state_changed(self, state: ca.SessionState) -> None:
        pass

    def changed(self, target: Target) -> None:
        self.targets.append(target)


def test_an_applied_departure_reports_every_watched_target_of_its_kafka_group(
    kafka_url: str, kafka_connect: Connect
) -> None:
    """A leave's ``DEPART`` record, once applied, reports each watched target read from that Kafka
    group, whatever the broker's group descriptions show: a listener's read may see a member in
    the instant between the Stable view naming it and its departure, a state no description of
    the driver saw, and only this report is then sure to be followed by a read without it (a
    chaos run on a Kafka cluster found a listener left with such a member for good). Targets of
    other Kafka groups and keys are not reported."""
    parsed, query = parse_url(kafka_url)
    merged = {**query, "session_timeout": SESSION_TIMEOUT}
    options = build_options(merged, KafkaBackend.options, "kafka", parsed)
    hints = _Hints()
    observer = KafkaBackend(parsed, options, hints)
    observer.open()
    try:
        watched = Target(TargetKind.GROUP, "g")
        others = [Target(TargetKind.ELECTION, "s"), Target(TargetKind.VALUE, "k")]
        for target in (watched, *others):
            observer.watch(target)
        joiner = kafka_connect()
        joiner.group("other").join("stays")  # the Kafka group is Stable with one member from here on

        def quiet() -> bool:
            before = len(hints.targets)
            time.sleep(1.0)
            return len(hints.targets) == before

        wait_until(quiet, 30, what="the first descriptions' reports to end")
        hints.targets.clear()
        joiner.group("other").join("passes")
        time.sleep(1.0)
        assert watched not in hints.targets  # what a read of "g" answers never changed
        joiner.group("other").leave("passes")
        wait_until(lambda: watched in hints.targets, 5, what="the departure reported for g")
        assert not set(others) & set(hints.targets)
    finally:
        observer.close()


def test_the_re_reads_after_one_departure_share_one_description(
    kafka_connect: Connect, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A departure reports every watched group of the session; their re-reads answer from one
    DescribeGroups requested after the report, not one each, and still see the departure."""
    watcher, holder, passer = kafka_connect(), kafka_connect(), kafka_connect()
    names = [f"w{index}" for index in range(40)]
    for name in names:
        holder.group(name).join("h")
    logs: dict[str, EventLog[ca.MembershipChanged]] = {name: EventLog() for name in names}
    for name in names:
        watcher.group(name).add_listener(logs[name])
    wait_until(lambda: all(log.events for log in logs.values()), 30, what="every group's first event")
    passer.group("w0").join("passes")
    wait_until(lambda: "passes" in logs["w0"].events[-1].members, 10, what="the join seen")
    rereads, describes = Counter[str](), Counter[str]()
    membership, describe = Groups.membership, Channel.describe

    def counted_membership(self: Groups, group: str, *, reread: bool = False) -> dict[str, bytes]:
        if reread:
            rereads[group] += 1
        return membership(self, group, reread=reread)

    def counted_describe(self: Channel, group_ids: list[str], deadline: float) -> dict[str, Any]:
        describes[threading.current_thread().name] += 1
        return describe(self, group_ids, deadline)

    monkeypatch.setattr(Groups, "membership", counted_membership)
    monkeypatch.setattr(Channel, "describe", counted_describe)
    passer.group("w0").leave("passes")
    wait_until(
        lambda: len(rereads) == len(names), 10, what="every watched group re-read", observe=lambda: rereads
    )
    wait_until(lambda: logs["w0"].events[-1].members.keys() == {"h"}, 10, what="the departure seen")
    on_dispatchers = sum(n for thread, n in describes.items() if thread.startswith("consensus-dispatch"))
    assert on_dispatchers <= 3, describes  # one per burst of reports; a late rebalance may add one
