"""Faults on a replicated cluster: the server leader killed or paused past the election timeout, the
node a client is connected to killed, a node partitioned from the others (a stale minority).

Marked ``cluster``: they run under ``consensus servers run NAME --nodes 3`` (the
control file names every node; the ``consensus_cluster`` fixture), and do not
apply to a URL naming a single server. Every session of a test uses
``CLUSTER_OPTIONS``: the cluster regains quorum well within its
``session_timeout``, so besides ``faults_support.recovered`` (no acknowledged
write lost, listeners converged, calls within request_timeout + 1 s, member and
leadership back) every test asserts that no session was LOST (same term, nothing
re-joined), that no two nodes led in one server-side term and no two leaders held
one term of ours, and that a write fenced with an old term is refused afterwards.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pytest

import consensus_api
from consensus_api import ConsensusError, Versioned
from consensus_testkit.conformance.cluster_support import (
    CLUSTER_OPTIONS,
    ELECTION_BOUND,
    ServerLeaders,
    StaleFence,
    serving_node,
    settled,
    wait_moved,
    wait_write_after,
)
from consensus_testkit.conformance.faults_support import CALL_LIMIT, Record, Subject, timed_call
from consensus_testkit.conformance.helpers import SessionFactory, wait_until

if TYPE_CHECKING:
    from consensus_api.session import Session
    from consensus_testkit.cluster import ClusterHandle

pytestmark = [pytest.mark.requires_server, pytest.mark.cluster]

#: How many times the partitioned-read test isolates a node: each time a fresh write, a fresh read.
PARTITION_ROUNDS = 3


def test_server_leader_killed_and_restarted(
    consensus_cluster: ClusterHandle,
    consensus_open_session: SessionFactory,
    consensus_ns: str,
    consensus_record: Record,
) -> None:
    """The node leading the cluster is SIGKILLed, the others elect a new leader, the node is restarted
    and rejoins: the session is never LOST, every call returns or raises within its limit, writes are
    acknowledged again once a new leader serves, and the common checks hold."""
    subject = Subject(consensus_open_session(**CLUSTER_OPTIONS), consensus_ns)
    fence = StaleFence.taken(subject.session, consensus_ns)
    with ServerLeaders(consensus_cluster) as leaders, subject.probe() as prober:
        leader = consensus_cluster.wait_leader(ELECTION_BOUND)
        killed = prober.fault_begins()
        consensus_cluster.kill(leader)
        others = [n for n in consensus_cluster.ids if n != leader]
        consensus_cluster.wait_leader(ELECTION_BOUND, among=others)
        consensus_record("server leader killed -> new leader serves", time.monotonic() - killed)
        consensus_record(
            "server leader killed -> first write", wait_write_after(prober, killed, ELECTION_BOUND)
        )
        consensus_cluster.spawn(leader)
        consensus_cluster.wait_ready(ELECTION_BOUND)
        prober.fault_ends()
        settled(subject, prober, leaders, fence, consensus_record)


def test_server_leader_paused_past_election_timeout(
    consensus_cluster: ClusterHandle,
    consensus_open_session: SessionFactory,
    consensus_ns: str,
    consensus_record: Record,
) -> None:
    """The leading node is SIGSTOPped until the others have elected a new leader (past the server-side
    election timeout, as in a long GC pause), then resumed: it must not lead again in its old term
    alongside the new leader, it rejoins as a follower and drops its clients, which move to other
    nodes; the session is never LOST, and the common checks hold."""
    subject = Subject(consensus_open_session(**CLUSTER_OPTIONS), consensus_ns)
    fence = StaleFence.taken(subject.session, consensus_ns)
    with ServerLeaders(consensus_cluster) as leaders, subject.probe() as prober:
        leader = consensus_cluster.wait_leader(ELECTION_BOUND)
        paused = prober.fault_begins()
        consensus_cluster.pause(leader)
        try:
            others = [n for n in consensus_cluster.ids if n != leader]
            consensus_cluster.wait_leader(ELECTION_BOUND, among=others)
            consensus_record("server leader paused -> new leader serves", time.monotonic() - paused)
        finally:
            consensus_cluster.resume(leader)
        consensus_record(
            "server leader paused -> first write", wait_write_after(prober, paused, ELECTION_BOUND)
        )
        consensus_cluster.wait_ready(ELECTION_BOUND)
        assert consensus_cluster.leader() != leader, "the paused leader leads again after its resume"
        prober.fault_ends()
        settled(subject, prober, leaders, fence, consensus_record)


def test_client_node_killed_session_fails_over(
    consensus_cluster: ClusterHandle,
    consensus_open_session: SessionFactory,
    consensus_ns: str,
    consensus_record: Record,
) -> None:
    """The node the session's client is connected to is SIGKILLed: the client moves to another node
    of the URL within session_timeout and keeps its session (never LOST: same member, same
    leadership term; ``cluster_support.wait_moved``), and the common checks hold; the node is
    restarted after."""
    subject = Subject(consensus_open_session(**CLUSTER_OPTIONS), consensus_ns)
    fence = StaleFence.taken(subject.session, consensus_ns)
    node = serving_node(consensus_cluster, subject.session)
    mark = len(subject.states)
    with ServerLeaders(consensus_cluster) as leaders, subject.probe() as prober:
        killed = prober.fault_begins()
        consensus_cluster.kill(node)
        wait_moved(consensus_cluster, subject, node, mark)
        consensus_record("client's node killed -> CONNECTED elsewhere", time.monotonic() - killed)
        moved = serving_node(consensus_cluster, subject.session)  # the node is dead: another one
        assert moved != node, (moved, node)
        consensus_record(
            "client's node killed -> first write", wait_write_after(prober, killed, ELECTION_BOUND)
        )
        consensus_cluster.spawn(node)
        consensus_cluster.wait_ready(ELECTION_BOUND)
        prober.fault_ends()
        settled(subject, prober, leaders, fence, consensus_record)


def test_partitioned_follower_never_serves_a_stale_read(
    consensus_cluster: ClusterHandle, consensus_ns: str, consensus_record: Record
) -> None:
    """Storage is linearizable across nodes: a follower is partitioned from the others while it keeps
    running (and still believes it follows), a write is acknowledged through a session pinned to the
    leader, and a read through a session pinned to the partitioned follower returns the new value or
    raises a ConsensusError within its limit - never the old value (a follower answering from its own
    copy would). After the partition heals, that session reads the new value (it may have been LOST
    meanwhile: its only node was cut off). Repeated ``PARTITION_ROUNDS`` times."""
    for round_ in range(PARTITION_ROUNDS):
        _partitioned_read(consensus_cluster, f"{consensus_ns}/stale-{round_}", consensus_record)


def _partitioned_read(cluster: ClusterHandle, key: str, record: Record) -> None:
    """One round of ``test_partitioned_follower_never_serves_a_stale_read`` on ``key``."""
    leader = cluster.wait_leader(ELECTION_BOUND)
    follower = next(n for n in cluster.ids if n != leader)
    with (
        consensus_api.connect(cluster.node_url(leader), **CLUSTER_OPTIONS) as writer,
        consensus_api.connect(cluster.node_url(follower), **CLUSTER_OPTIONS) as reader,
    ):
        before = Versioned(b"old", writer.storage.put(key, b"old"))
        wait_until(lambda: _read(reader, key) == before, what="the follower's session reads the old value")
        cluster.isolate(follower)
        try:
            version = _acknowledged_update(writer, key, b"new")
            status = cluster.status(follower)  # typically still "follower": it has not noticed yet
            got, error, seconds = timed_call(CALL_LIMIT, lambda: reader.storage.fetch(key))
            assert got is None or got == Versioned(b"new", version), (
                f"the partitioned follower served {got}, not the acknowledged {Versioned(b'new', version)}"
            )
            assert got is not None or isinstance(error, ConsensusError)
            outcome = "new value" if got else type(error).__name__
            record(f"read via partitioned follower -> {outcome}", seconds, note=f"its status then: {status}")
        finally:
            cluster.heal(follower)
        cluster.wait_ready(ELECTION_BOUND)
        healed = wait_until(
            lambda: _read(reader, key), ELECTION_BOUND, what="the follower's session reads again"
        )
        assert healed == Versioned(b"new", version), healed


def _acknowledged_update(session: Session, key: str, value: bytes) -> int:
    """Update ``key`` through ``session`` until one attempt is acknowledged (the majority may first
    have to elect a leader); its version."""
    attempts: list[BaseException | None] = []

    def attempt() -> int | None:
        current, error, _ = timed_call(CALL_LIMIT, lambda: session.storage.fetch(key))
        if isinstance(current, Versioned):
            update = lambda: session.storage.update(key, value, version=current.version)  # noqa: E731
            version, error, _ = timed_call(CALL_LIMIT, update)
            if isinstance(version, int):
                return version
        attempts.append(error)
        return None

    return wait_until(
        attempt, ELECTION_BOUND, what="the majority acknowledges a write", observe=lambda: attempts[-3:]
    )


def _read(session: Session, key: str) -> Versioned | None:
    try:
        return session.storage.fetch(key)
    except ConsensusError:
        return None
