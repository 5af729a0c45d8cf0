"""The Kafka backend against real Kafka 4.x KRaft brokers.

Storage (racing conditional writes, versions, fencing in log order), group
membership and election on the real group protocol (dead sessions, SIGKILLed
processes, hand-over), connection and credentials. The pure parts (state
machine, record format, group-leader assignment, options): tests/test_kafka_units.py.
Broker faults: tests/test_kafka_broker_faults.py.
A crash is a real one: a child process holding the session (``conformance.worker hold``) is SIGKILLed.
"""

from __future__ import annotations

import logging
import signal
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import pytest

import consensus_api as ca
from consensus_api.backend import Target, TargetKind
from consensus_api.config import Secret, build_options, parse_url
from consensus_backends.kafka import KafkaBackend
from consensus_backends.kafka.channel import Channel
from consensus_backends.kafka.groups import Groups
from consensus_testkit import ServerHandle, start_server
from consensus_testkit.conformance.helpers import EventLog, wait_until
from consensus_testkit.conformance.worker import WorkerProcess

LOST, SUSPENDED, CONNECTED = ca.SessionState.LOST, ca.SessionState.SUSPENDED, ca.SessionState.CONNECTED
SESSION_TIMEOUT = 3.0
#: How late a dead session's member may leave: session timeout, one rebalance, the observer's poll.
DEPARTURE_SLACK = 2.0


# Fixtures and helpers


@pytest.fixture(scope="module")
def server() -> Iterator[ServerHandle]:
    with start_server("kafka") as handle:
        yield handle


@pytest.fixture
def url(server: ServerHandle) -> str:
    """A fresh prefix (so a fresh command-log topic) per test."""
    return f"{server.url}/t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def connect(url: str) -> Iterator[Any]:
    sessions: list[ca.Session] = []

    def factory(**options: Any) -> ca.Session:
        session = ca.connect(url, **{"session_timeout": SESSION_TIMEOUT, **options})
        sessions.append(session)
        return session

    yield factory
    for session in sessions:
        session.close()


Holder = Callable[..., WorkerProcess]


@pytest.fixture
def holder(url: str) -> Iterator[Holder]:
    """``holder(group, member, service, candidate)``: a child process whose session joined ``group`` as
    ``member`` and nominated ``candidate`` for ``service`` (READY); SIGKILL it to crash; reaped at the end."""
    children: list[WorkerProcess] = []

    def factory(group: str, member: str, service: str, candidate: str) -> WorkerProcess:
        args = ["--group", group, "--member", member, "--service", service, "--candidate", candidate]
        children.append(WorkerProcess(url, "hold", args, {"session_timeout": SESSION_TIMEOUT}))
        children[-1].expect("READY", 60)
        return children[-1]

    yield factory
    for child in children:
        child.close()


# Storage


def race(*calls: Callable[[], object]) -> list[object]:
    """Run ``calls`` at once, one thread each; their results, or the ``ConsensusError`` each raised."""
    barrier = threading.Barrier(len(calls))
    results: list[object] = [None] * len(calls)

    def run(index: int) -> None:
        barrier.wait()
        try:
            results[index] = calls[index]()
        except ca.ConsensusError as exc:
            results[index] = exc

    threads = [threading.Thread(target=run, args=(index,)) for index in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return results


def test_racing_conditional_writes_have_one_winner_both_sessions_agree(connect: Any) -> None:
    """Two sessions race update(version=v) on one key, 30 times: one wins each race, both read the same."""
    first, second = connect(), connect()
    version = first.storage.put("race/k", b"0")
    for round_ in range(30):
        values = (f"a{round_}".encode(), f"b{round_}".encode())
        results = race(
            partial(first.storage.update, "race/k", values[0], version=version),
            partial(second.storage.update, "race/k", values[1], version=version),
        )
        winners = [index for index, result in enumerate(results) if isinstance(result, int)]
        assert len(winners) == 1, results
        [loser] = [result for result in results if not isinstance(result, int)]
        assert isinstance(loser, ca.VersionConflictError)
        version = int(results[winners[0]])  # type: ignore[call-overload]
        expected = ca.Versioned(values[winners[0]], version)
        assert first.storage.fetch("race/k") == expected == second.storage.fetch("race/k")


def test_racing_puts_have_one_winner(connect: Any) -> None:
    """Five sessions put one key at once: exactly one version, the others KeyExistsError."""
    sessions = [connect() for _ in range(5)]
    results = race(*(lambda s=s, i=i: s.storage.put("once", str(i).encode()) for i, s in enumerate(sessions)))
    winners = [index for index, result in enumerate(results) if isinstance(result, int)]
    assert len(winners) == 1, results
    assert all(isinstance(result, ca.KeyExistsError) for result in results if not isinstance(result, int))
    expected = ca.Versioned(str(winners[0]).encode(), int(results[winners[0]]))  # type: ignore[call-overload]
    assert all(session.storage.fetch("once") == expected for session in sessions)


def test_versions_increase_across_delete_and_recreate(connect: Any) -> None:
    """Versions are log positions: they rise across updates, delete and re-create; old ones conflict."""
    session, other = connect(), connect()
    seen = [session.storage.put("v/k", b"1"), session.storage.update("v/k", b"2")]
    session.storage.delete("v/k")
    other.storage.put("v/unrelated", b"x")
    seen.append(other.storage.put("v/k", b"3"))
    assert seen == sorted(set(seen))
    for stale in seen[:2]:
        with pytest.raises(ca.VersionConflictError):
            session.storage.update("v/k", b"stale", version=stale)
    assert session.storage.fetch("v/k") == ca.Versioned(b"3", seen[-1])


def test_fence_is_decided_in_log_order(connect: Any) -> None:
    """A fence checked by a third session (no local knowledge of the candidacy): accepted while the
    lease is current, rejected once the next leader's claim precedes the write in the log."""
    leader, heir, writer = connect(), connect(), connect()
    assert leader.election("svc").nominate("a") is True
    assert heir.election("svc").nominate("b") is False
    old = writer.election("svc").leadership()
    assert old is not None and old.leader_id == "a"
    assert writer.storage.put("f/before", b"ok", fence=old) > 0
    leader.election("svc").resign("a")
    new = writer.election("svc").leadership()
    assert new is not None and new.leader_id == "b" and new.term > old.term
    with pytest.raises(ca.FencedError):
        writer.storage.put("f/after", b"late", fence=old)
    assert writer.storage.fetch("f/after") is None
    assert writer.storage.put("f/after", b"new leader", fence=new) > new.term


def test_big_values_and_a_new_reader_replays_the_log(connect: Any) -> None:
    """A 1 MiB value round-trips, and a session opened later rebuilds the same state from the log."""
    session = connect()
    big = bytes(range(256)) * 4096
    version = session.storage.put("big", big)
    for index in range(20):
        session.storage.put(f"many/{index}", str(index).encode())
    late = connect()
    assert late.storage.fetch("big") == ca.Versioned(big, version)
    assert late.storage.keys("many") == {f"many/{index}" for index in range(20)}


# Membership and election


def test_killed_members_session_leaves_for_an_observer_that_never_joined(
    connect: Any, holder: Holder
) -> None:
    """A member and candidate in a SIGKILLed child process are gone, for an observer that never joined,
    once the session timed out (no LeaveGroup: not earlier) and within the bound."""
    observer = connect()
    child = holder("workers", "w1", "svc", "c")
    assert observer.group("workers").membership() == {"w1": b"child"}
    child.signal(signal.SIGKILL)
    killed = time.monotonic()
    bound = SESSION_TIMEOUT + DEPARTURE_SLACK
    wait_until(lambda: "w1" not in observer.group("workers").members(), bound, what="the killed member gone")
    assert time.monotonic() - killed >= SESSION_TIMEOUT * 0.8  # it was the session timeout, not a leave
    wait_until(lambda: observer.election("svc").leadership() is None, bound, what="its candidacy gone")


def test_close_leaves_at_once(connect: Any) -> None:
    """close() sends LeaveGroup: member and candidacy are gone for others as it returns, well before the
    session timeout would have removed them."""
    member, observer = connect(), connect()
    member.group("g").join("m")
    member.election("s").nominate("m")
    started = time.monotonic()
    member.close()
    assert observer.group("g").members() == frozenset()
    assert observer.election("s").leadership() is None
    assert time.monotonic() - started < SESSION_TIMEOUT


def test_killed_leader_hands_over_with_a_higher_term(connect: Any, holder: Holder) -> None:
    """The leader's process SIGKILLed: the next candidate takes over after the session timeout with a
    higher term; listeners see it."""
    heir, observer = connect(), connect()
    leader = holder("g", "m", "svc", "a")
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


def test_leader_stays_while_candidates_come_and_go(connect: Any, holder: Holder) -> None:
    """Sticky: joins and departures of followers - a resignation, a SIGKILLed process - change neither
    the leader nor its term. The killed follower's member (same session) leaving shows its session is
    gone; the check waits for that, then ``DEPARTURE_SLACK`` for the election's own rebalance."""
    leader, observer = connect(), connect()
    assert leader.election("svc").nominate("a") is True
    first = leader.election("svc").leadership()
    log: EventLog[ca.LeaderChanged] = EventLog("leader")
    observer.election("svc").add_listener(log)
    log.wait_for(lambda event: event.leader_id == "a")
    doomed = holder("g", "f0", "svc", "f0")
    followers = [connect() for _ in range(2)]
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
    assert connect().election("svc").nominate("f3") is False
    assert observer.election("svc").leadership() == first
    assert first is not None and log.events == [ca.LeaderChanged("svc", "a", first.term)]


def test_racing_duplicate_joins_leave_one_member(connect: Any) -> None:
    """Four sessions join one id at once: the group leader accepts one, the others get MemberExistsError."""
    sessions = [connect() for _ in range(4)]
    results = race(
        *(lambda s=s, i=i: s.group("g").join("same", str(i).encode()) for i, s in enumerate(sessions))
    )
    winners = [index for index, result in enumerate(results) if result is None]
    assert len(winners) == 1, results
    assert all(isinstance(result, ca.MemberExistsError) for result in results if result is not None)
    assert sessions[0].group("g").membership() == {"same": str(winners[0]).encode()}


def test_members_of_one_session_share_a_kafka_member(connect: Any) -> None:
    """Three members joined by one session are one Kafka group member; leaving the middle one hides it
    from an observer at once while the others stay; another session's duplicate of a shared id is
    rejected by the group leader; the last leave takes the Kafka member out of the group."""
    joiner, rival, observer = connect(), connect(), connect()
    group = joiner.group("g")
    for index in range(3):
        group.join(f"m{index}", b"%d" % index)
    assert len(joiner._backend.fault_identity()["members"]) == 1
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


def test_an_applied_departure_reports_every_watched_target_of_its_kafka_group(url: str, connect: Any) -> None:
    """A leave's ``DEPART`` record, once applied, reports each watched target read from that Kafka
    group, whatever the broker's group descriptions show: a listener's read may see a member in
    the instant between the Stable view naming it and its departure, a state no description of
    the driver saw, and only this report is then sure to be followed by a read without it (a
    chaos run on a Kafka cluster found a listener left with such a member for good). Targets of
    other Kafka groups and keys are not reported."""
    parsed, query = parse_url(url)
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
        joiner = connect()
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
    connect: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A departure reports every watched group of the session; their re-reads answer from one
    DescribeGroups requested after the report, not one each, and still see the departure."""
    watcher, holder, passer = connect(), connect(), connect()
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


# Connection, options and credentials


def test_unreachable_broker_raises_backend_unavailable_in_time() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    started = time.monotonic()
    with pytest.raises(ca.BackendUnavailableError):
        ca.connect(f"kafka://127.0.0.1:{port}/x", connect_timeout=1.5)
    # connect_timeout plus slack for a loaded 2-core machine; benchmarks/detection.py times it
    assert time.monotonic() - started < 1.5 + 3


def test_credentials_never_appear_in_errors_reprs_or_logs(server: ServerHandle, caplog: Any) -> None:
    """The broker has no SASL listener: the SASL handshake is refused at once, as a configuration
    error naming SASL; the password shows up nowhere."""
    secret = "s3cr3t-" + uuid.uuid4().hex
    caplog.set_level(logging.DEBUG)
    url = server.url.replace("kafka://", f"kafka://alice:{secret}@") + "/cred"
    started = time.monotonic()
    with pytest.raises(ca.ConfigurationError, match="SASL") as raised:
        ca.connect(url, connect_timeout=8)
    assert time.monotonic() - started < 2.0, "a refused SASL handshake must not be retried"
    assert secret not in str(raised.value) and secret not in repr(raised.value)
    assert repr(Secret(secret)) == "'***'"
    assert not [record for record in caplog.records if secret in record.getMessage()]
