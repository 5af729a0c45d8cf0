"""Membership views on a 3-node Kafka cluster while the group coordinator's node is cut off from the
others (issue 40, item 7: the chaos finding of history 20261128T131918-ef0f25), real brokers only."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable

import consensus_api as ca
from consensus_backends.kafka.testkit.cluster import group_coordinator
from consensus_testkit import start_cluster
from consensus_testkit.cluster import ClusterHandle

#: Long enough that the members heartbeating the cut-off coordinator outlive its replacement's
#: session timers until the heal sends them over.
OPTIONS: dict[str, float] = {"session_timeout": 8, "request_timeout": 10, "connect_timeout": 30}
#: How long the coordinator's node stays cut off once it knows another broker took the groups over.
HEAL_AFTER = 1.0


def _until(check: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def _coordinator(cluster: ClusterHandle, node: int) -> int | None:
    """The node coordinating every group (the cluster has one offsets partition), as ``node`` says;
    the first call creates the offsets topic."""
    return group_coordinator(cluster.node(node).port, "any")


def _coordinator_off_the_quorum_leader(cluster: ClusterHandle) -> int:
    """The groups' coordinator, moved off the controller quorum's leader if it is there (its node
    killed and started again): a cut-off quorum leader is not replaced in these clusters, whose
    partitions, as the chaos nemesis', cut off a quorum follower."""
    for _ in range(5):
        _until(lambda: _coordinator(cluster, 1) is not None, 30)
        coordinator, leader = _coordinator(cluster, 1), cluster.wait_leader(30)
        if coordinator not in (None, leader):
            return coordinator
        cluster.kill(leader)
        cluster.wait_leader(30, among=[n for n in cluster.ids if n != leader])
        cluster.spawn(leader)
        cluster.wait_ready(60)
    raise AssertionError("the coordinator stayed on the quorum leader")


def _recorder(seen: list[frozenset[str]]) -> Callable[[ca.MembershipChanged], None]:
    return lambda change: seen.append(frozenset(change.members))


def test_no_view_loses_a_member_that_never_left_while_the_coordinator_is_cut_off() -> None:
    """One session joins ``first``, then ``last``, and the groups' coordinator is cut off from the
    other brokers (clients still reach it) as soon as ``last``'s generation completes, until
    another broker has taken the groups over; the session joins ``new`` and leaves ``first``
    across the heal. The broker that took over may describe the group at the generation before
    ``last``'s for a while (its committed state can end before that generation's record); still
    no observer's view ever lacks ``last`` once it saw it, no session is lost, and every observer
    ends at {last, new}."""
    with start_cluster("kafka", 3) as cluster:
        coordinator = _coordinator_off_the_quorum_leader(cluster)
        url = f"{cluster.url}/t-{uuid.uuid4().hex[:12]}"
        observers = [ca.connect(url, **OPTIONS) for _ in range(3)]
        worker = ca.connect(url, **OPTIONS)
        states: list[ca.SessionState] = []
        views: list[list[frozenset[str]]] = [[] for _ in observers]
        try:
            for session in [*observers, worker]:
                session.add_state_listener(states.append)
            for session, seen in zip(observers, views, strict=True):
                session.group("g").add_listener(_recorder(seen))
            group = worker.group("g")
            group.join("first")
            _until(lambda: all(seen and seen[-1] == {"first"} for seen in views), 30)
            group.join("last")
            cluster.isolate(coordinator)  # before the other brokers learn that last's generation is committed
            healer = threading.Timer(HEAL_AFTER, cluster.heal, args=(coordinator,))
            try:
                # Another broker has taken the groups over and the cut-off one knows it: it refuses
                # descriptions, and the observers move to the new coordinator.
                _until(lambda: _coordinator(cluster, coordinator) not in (None, coordinator), 30)
                healer.start()
                group.join("new")
                group.leave("first")
            finally:
                healer.cancel()
                cluster.heal(coordinator)
            _until(lambda: all(seen and seen[-1] == {"last", "new"} for seen in views), 30)
        finally:
            for session in [*observers, worker]:
                session.close()
    assert ca.SessionState.LOST not in states
    for seen in views:
        first = next(index for index, view in enumerate(seen) if "last" in view)
        assert all("last" in view for view in seen[first:]), seen
