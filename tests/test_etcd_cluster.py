"""The etcd cluster from consensus_testkit: members, peer links routed per source node, the
leader from the Maintenance Status call, a session failing over between the URL's endpoints, and
``consensus servers run etcd --nodes 3`` (real servers only)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cluster_support import FAILOVER, run_under_servers

import consensus_api
from consensus_testkit import start_cluster
from consensus_testkit.cluster import FOLLOWER, LEADER, ClusterHandle, NodeStatus

OPTIONS: dict[str, float] = {"session_timeout": 8, "request_timeout": 3, "connect_timeout": 15}


@pytest.fixture(scope="module")
def etcd_cluster() -> Iterator[ClusterHandle]:
    with start_cluster("etcd", 3) as cluster:
        yield cluster


def _until(check: Callable[[], bool], timeout: float) -> float:
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < timeout, "condition not met in time"
        time.sleep(0.05)
    return time.monotonic() - started


def test_isolated_follower_loses_its_leader_and_refuses_reads(etcd_cluster: ClusterHandle) -> None:
    """An isolated member (its peer links stalled, its client port open) stops knowing a leader within
    a few election timeouts, a session pinned to it cannot read, the other two keep their leader and
    term (pre-vote: the isolated member's term stays too); healed, it follows again."""
    cluster = etcd_cluster
    leader = cluster.wait_leader(30)
    term = cluster.status(leader).term  # type: ignore[union-attr]
    follower = next(n for n in cluster.ids if n != leader)
    assert cluster.status(follower) == NodeStatus(FOLLOWER, term)
    with consensus_api.connect(cluster.node_url(follower), **OPTIONS) as pinned:
        pinned.storage.put("t/k", b"1")
        cluster.isolate(follower)
        try:
            _until(lambda: (s := cluster.status(follower)) is not None and s.role != FOLLOWER, 15)
            with pytest.raises(consensus_api.ConsensusError):
                pinned.storage.fetch("t/k")
            assert cluster.leader() == leader
            assert cluster.status(leader) == NodeStatus(LEADER, term)
        finally:
            cluster.heal(follower)
        cluster.wait_ready(30)
        _until(lambda: _fetch(pinned) == b"1", 15)


def _fetch(session: consensus_api.Session) -> bytes | None:
    try:
        got = session.storage.fetch("t/k")
    except consensus_api.ConsensusError:
        return None
    return None if got is None else got.value


def _put(session: consensus_api.Session) -> bool:
    try:
        session.storage.put("t/after", b"x")
    except consensus_api.ConsensusError:
        return False
    return True


def test_session_fails_over_when_its_member_is_killed(etcd_cluster: ClusterHandle) -> None:
    """A session on the cluster's URL moves to another member when the one it uses is SIGKILLed and
    writes again, keeping its lease (never LOST); ``serving`` follows it."""
    cluster = etcd_cluster
    cluster.wait_ready(30)
    with consensus_api.connect(cluster.url, **OPTIONS) as session:
        states: list[consensus_api.SessionState] = []
        session.add_state_listener(states.append)
        backend = session._backend
        lease = backend.fault_identity()["lease"]
        node = cluster.serving(backend.fault_identity())
        assert node is not None
        cluster.kill(node)
        try:
            _until(lambda: cluster.serving(backend.fault_identity()) not in (None, node), 10)
            _until(lambda: _put(session), 15)  # the killed member may have led: an election first
            assert backend.fault_identity()["lease"] == lease
            assert consensus_api.SessionState.LOST not in states, states
        finally:
            cluster.spawn(node)
            cluster.wait_ready(30)


def test_etcd_cluster_under_servers_run(tmp_path: Path) -> None:
    """``consensus servers run etcd --nodes 3``: the URL names three members, a process attached to the
    control file kills the leader, the others elect one in a higher term, the old one rejoins as a
    follower; nothing is left running afterwards."""
    run_under_servers(
        tmp_path,
        "etcd",
        FAILOVER + "assert cluster.status(leader).role == 'follower', cluster.status(leader)\n",
        timeout=240,
    )
