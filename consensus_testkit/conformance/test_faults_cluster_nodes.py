"""Faults of a cluster's nodes besides its leader: a follower lost, the client's node partitioned, every
node restarted in turn, quorum lost and regained.

Marked ``cluster`` like ``test_faults_cluster.py`` (see its docstring for the
sessions' options and the checks every test ends with: ``cluster_support.settled``).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pytest

from consensus_testkit.conformance.cluster_support import (
    CLUSTER_OPTIONS,
    CLUSTER_SESSION_TIMEOUT,
    ELECTION_BOUND,
    ServerLeaders,
    StaleFence,
    serving_node,
    settled,
    wait_moved,
    wait_write_after,
)
from consensus_testkit.conformance.faults_support import Record, Subject
from consensus_testkit.conformance.helpers import wait_until

if TYPE_CHECKING:
    from consensus_testkit.cluster import ClusterHandle
    from consensus_testkit.conformance.helpers import SessionFactory
    from consensus_testkit.profile import TestProfile

pytestmark = [pytest.mark.requires_server, pytest.mark.cluster]


def test_follower_the_client_does_not_use_killed(
    consensus_cluster: ClusterHandle,
    consensus_open_session: SessionFactory,
    consensus_ns: str,
    consensus_record: Record,
) -> None:
    """A follower that does not serve the session is SIGKILLed and restarted later: the remaining
    majority keeps acknowledging writes, the session stays CONNECTED throughout (no SUSPENDED even),
    and the common checks hold."""
    subject = Subject(consensus_open_session(**CLUSTER_OPTIONS), consensus_ns)
    fence = StaleFence.taken(subject.session, consensus_ns)
    leader, serving = (
        consensus_cluster.wait_leader(ELECTION_BOUND),
        serving_node(consensus_cluster, subject.session),
    )
    victim = next(n for n in consensus_cluster.ids if n not in (leader, serving))
    mark = len(subject.states)
    with ServerLeaders(consensus_cluster) as leaders, subject.probe() as prober:
        killed = prober.fault_begins()
        consensus_cluster.kill(victim)
        time.sleep(1.0)
        consensus_record("follower killed -> first write", wait_write_after(prober, killed, ELECTION_BOUND))
        consensus_cluster.spawn(victim)
        consensus_cluster.wait_ready(ELECTION_BOUND)
        prober.fault_ends()
        assert subject.states.events[mark:] == [], f"the session noticed a follower's loss: {subject.states}"
        assert consensus_cluster.leader() == leader, "a follower's loss moved the leadership"
        settled(subject, prober, leaders, fence, consensus_record)


def test_client_node_partitioned_session_fails_over(
    consensus_cluster: ClusterHandle,
    consensus_open_session: SessionFactory,
    consensus_ns: str,
    consensus_record: Record,
) -> None:
    """The follower the session is connected to is partitioned from the other nodes (it keeps running
    and accepting clients): it stops serving, the client moves to another node of the URL within
    session_timeout and keeps its session (never LOST; SUSPENDED meanwhile only where the session is
    bound to its connection, as ZooKeeper's is, not an etcd lease, or where the node goes on
    answering as it did, as a Kafka partition leader does); healed, the node follows again and the
    common checks hold. Where new sessions keep landing on the leader (every Kafka session of one
    URL uses its command log's leader, which may be the KRaft leader too), the leader is restarted
    first, which moves the leadership."""
    leader = consensus_cluster.wait_leader(ELECTION_BOUND)
    subject = None
    for attempt in range(10):  # a session whose client is on a follower (the URL's order is shuffled)
        candidate = Subject(consensus_open_session(**CLUSTER_OPTIONS), f"{consensus_ns}/{attempt}")
        if serving_node(consensus_cluster, candidate.session) != leader:
            subject = candidate
            break
        candidate.session.close()
        if attempt >= 2:
            consensus_cluster.restart(ELECTION_BOUND, node=leader)
            leader = consensus_cluster.wait_leader(ELECTION_BOUND)
    assert subject is not None, "no session of ten connected to a follower"
    node = serving_node(consensus_cluster, subject.session)
    fence = StaleFence.taken(subject.session, subject.ns)
    mark = len(subject.states)
    with ServerLeaders(consensus_cluster) as leaders, subject.probe() as prober:
        cut = prober.fault_begins()
        consensus_cluster.isolate(node)
        try:
            wait_moved(consensus_cluster, subject, node, mark)
            consensus_record("client's node partitioned -> CONNECTED elsewhere", time.monotonic() - cut)
            consensus_record(
                "client's node partitioned -> first write", wait_write_after(prober, cut, ELECTION_BOUND)
            )
        finally:
            consensus_cluster.heal(node)
        consensus_cluster.wait_ready(ELECTION_BOUND)
        prober.fault_ends()
        identity = subject.session._backend.fault_identity()  # the SPI's test-only hook
        wait_until(  # a healed Kafka broker may still claim the log's leadership for a moment
            lambda: consensus_cluster.serving(identity) not in (None, node),
            CLUSTER_SESSION_TIMEOUT,
            what="the session served by another node than the healed one",
        )
        settled(subject, prober, leaders, fence, consensus_record)


def test_rolling_restart_of_every_node(
    consensus_cluster: ClusterHandle,
    consensus_open_session: SessionFactory,
    consensus_ns: str,
    consensus_record: Record,
) -> None:
    """Every node is SIGKILLed and restarted in turn, the leader last, each once the cluster serves
    again (a rolling upgrade): the session follows the cluster without ever being LOST, and the
    common checks hold."""
    subject = Subject(consensus_open_session(**CLUSTER_OPTIONS), consensus_ns)
    fence = StaleFence.taken(subject.session, consensus_ns)
    with ServerLeaders(consensus_cluster) as leaders, subject.probe() as prober:
        started = prober.fault_begins()
        leader = consensus_cluster.wait_leader(ELECTION_BOUND)
        for node in [*(n for n in consensus_cluster.ids if n != leader), leader]:
            consensus_cluster.restart(ELECTION_BOUND, node=node)
        consensus_record("rolling restart of 3 nodes", time.monotonic() - started)
        prober.fault_ends()
        settled(subject, prober, leaders, fence, consensus_record)


def test_quorum_lost_and_regained_within_session_timeout(
    consensus_cluster: ClusterHandle,
    consensus_open_session: SessionFactory,
    consensus_profile: TestProfile,
    consensus_ns: str,
    consensus_record: Record,
) -> None:
    """Two of three nodes are SIGKILLed (no quorum: nothing is acknowledged, every call returns or
    raises within its limit) and one is restarted a second later: the cluster serves again within
    session_timeout (``CLUSTER_SESSION_TIMEOUT`` plus the profile's ``restart_delay``, the time a
    restarted node of the backend needs beyond ZooKeeper's; checked), the session is never LOST,
    and the common checks hold."""
    timeout = CLUSTER_SESSION_TIMEOUT + consensus_profile.restart_delay
    subject = Subject(consensus_open_session(**{**CLUSTER_OPTIONS, "session_timeout": timeout}), consensus_ns)
    fence = StaleFence.taken(subject.session, consensus_ns)
    leader = consensus_cluster.wait_leader(ELECTION_BOUND)
    first, second = next(n for n in consensus_cluster.ids if n != leader), leader
    with ServerLeaders(consensus_cluster) as leaders, subject.probe() as prober:
        killed = prober.fault_begins()
        consensus_cluster.kill(first)
        consensus_cluster.kill(second)
        lost = time.monotonic()
        time.sleep(1.0)
        back = time.monotonic()
        consensus_cluster.spawn(second)
        consensus_cluster.wait_leader(ELECTION_BOUND)
        regained = time.monotonic() - killed
        consensus_record("quorum lost -> serving again (one node back after 1 s)", regained)
        assert regained < timeout, (
            f"the premise failed: the cluster served again {regained:.1f}s after losing quorum, "
            f"not within the session timeout ({timeout:g}s)"
        )
        consensus_record("quorum lost -> first write", wait_write_after(prober, killed, ELECTION_BOUND))
        consensus_cluster.spawn(first)
        consensus_cluster.wait_ready(ELECTION_BOUND)
        prober.fault_ends()
        without = [
            c for c in prober.calls if c.name == "put" and c.started >= lost and c.started + c.seconds <= back
        ]
        assert all(c.outcome != "ok" for c in without), (
            f"a write was acknowledged without a quorum: {without}"
        )
        settled(subject, prober, leaders, fence, consensus_record)
