"""Support for the cluster tests of the ``faults`` section (``test_faults_cluster.py``).

Nothing here imports pytest. Besides ``faults_support``'s checks, every
cluster test watches the servers (``ServerLeaders``: never two nodes leading
in one server-side term) and checks fencing across the fault (``StaleFence``:
a write fenced with a term older than the current leadership is refused, one
with the current term accepted).
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING

from consensus_api.errors import FencedError
from consensus_api.model import LeaderChanged, Leadership, SessionState
from consensus_api.session import Session
from consensus_testkit.conformance.faults_support import (
    CALL_LIMIT,
    REQUEST_TIMEOUT,
    Record,
    Subject,
    loss_bound,
    not_connected,
    recovered,
    timed_call,
)
from consensus_testkit.conformance.helpers import unique, wait_until
from consensus_testkit.conformance.prober import Prober

if TYPE_CHECKING:
    from consensus_testkit.cluster import ClusterHandle
    from consensus_testkit.conformance.helpers import EventLog

#: The session timeout of a cluster test's sessions: a server-side election (ZooKeeper: about 1 s to
#: notice the leader gone, up to a few seconds to elect and sync) fits in it with room to spare, so no
#: session may be LOST.
CLUSTER_SESSION_TIMEOUT = 8.0
CLUSTER_OPTIONS: dict[str, object] = {
    "session_timeout": CLUSTER_SESSION_TIMEOUT,
    "request_timeout": REQUEST_TIMEOUT,
    "connect_timeout": 15,
}
#: How long the cluster may take to elect a server leader or to serve again after a node is back.
ELECTION_BOUND = 30.0
#: How often ``ServerLeaders`` asks every node.
WATCH_INTERVAL = 0.05


class ServerLeaders:
    """A thread asking every node of a cluster, until ``stop``, which one leads in which server-side
    term; ``check`` asserts that no term ever had two leading nodes."""

    def __init__(self, cluster: ClusterHandle) -> None:
        self.cluster = cluster
        self.seen: dict[int, set[int]] = defaultdict(set)  # term -> nodes that said they lead in it
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ct-server-leaders", daemon=True)

    def __enter__(self) -> ServerLeaders:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.wait(WATCH_INTERVAL):
            for node in self.cluster.ids:
                status = self.cluster.status(node)
                if status is not None and status.role == "leader" and status.term is not None:
                    self.seen[status.term].add(node)

    def check(self) -> None:
        """Assert that every server-side term had one leading node, and that one was seen at all."""
        assert self.seen, "no node was ever seen leading"
        double = {term: nodes for term, nodes in self.seen.items() if len(nodes) > 1}
        assert not double, f"two nodes led in one server-side term: {double}"


@dataclass
class StaleFence:
    """Two leaderships of one service, one after the other, taken before a fault: ``check`` (after
    it) asserts that a write fenced with the older term is refused and one with the newer accepted."""

    old: Leadership
    new: Leadership
    key: str

    @classmethod
    def taken(cls, session: Session, namespace: str) -> StaleFence:
        """Lead a fresh service as ``old``, resign, lead it again as ``new`` (a higher term)."""
        election = session.election(unique("ct-fence"))
        assert election.nominate("old")
        old = election.leadership()
        election.resign("old")
        assert election.nominate("new")
        new = election.leadership()
        assert old is not None and new is not None and new.term > old.term, (old, new)
        return cls(old, new, f"{namespace}/fenced")

    def check(self, session: Session) -> None:
        """Through ``session``: the old term's write raises ``FencedError``, the new term's succeeds;
        each within a call's limit."""
        storage = session.storage
        _, error, _ = timed_call(CALL_LIMIT, lambda: storage.put(self.key, b"old", fence=self.old))
        assert isinstance(error, FencedError), f"a write fenced with the old term {self.old} got {error!r}"
        version, error, _ = timed_call(CALL_LIMIT, lambda: storage.put(self.key, b"new", fence=self.new))
        assert error is None and isinstance(version, int), f"the current term's write failed: {error!r}"
        stored = storage.fetch(self.key)
        assert stored is not None and stored.value == b"new", stored


def one_leader_per_term(leaders: EventLog[LeaderChanged]) -> None:
    """Assert that the leader events never named two leaders for one term."""
    by_term: dict[int, set[str]] = defaultdict(set)
    for event in leaders.events:
        if event.leader_id is not None and event.term is not None:
            by_term[event.term].add(event.leader_id)
    double = {term: ids for term, ids in by_term.items() if len(ids) > 1}
    assert not double, f"two leaders in one term: {double}"


def settled(
    subject: Subject, prober: Prober, leaders: ServerLeaders, fence: StaleFence, record: Record
) -> None:
    """The checks every cluster fault test ends with: ``faults_support.recovered`` within the loss
    bound of ``CLUSTER_SESSION_TIMEOUT``, the session never LOST, one leading node per server-side
    term, one leader of ours per term, and the stale fence refused."""
    recovered(subject, prober, loss_bound(subject.session, CLUSTER_SESSION_TIMEOUT), record)
    assert not subject.lost(), f"the session was LOST although quorum came back in time: {subject.states}"
    leaders.check()
    one_leader_per_term(subject.leaders)
    fence.check(subject.session)


def serving_node(cluster: ClusterHandle, session: Session) -> int:
    """The node holding ``session``'s client connection (waits up to 10 s for one)."""
    identity = session._backend.fault_identity()  # the SPI's test-only hook
    return wait_until(lambda: cluster.serving(identity), 10, what="the node serving the session")


def wait_moved(cluster: ClusterHandle, subject: Subject, node: int, mark: int) -> None:
    """Wait (at most ``CLUSTER_SESSION_TIMEOUT`` each) until the session reported trouble since the
    state event ``mark`` or another node than ``node`` serves it, then, if it reported anything,
    until it is CONNECTED again. A session bound to its connection (ZooKeeper's) is SUSPENDED while
    it moves; an etcd session (a lease) moves between members without trouble."""
    backend = subject.session._backend  # fault_identity: the SPI's test-only hook
    wait_until(
        lambda: (
            any(map(not_connected, subject.states.events[mark:]))
            or cluster.serving(backend.fault_identity()) not in (None, node)
        ),
        CLUSTER_SESSION_TIMEOUT,
        what="SUSPENDED, or the session served by another node",
    )
    if subject.states.events[mark:]:
        subject.states.wait_last(lambda state: state is SessionState.CONNECTED, CLUSTER_SESSION_TIMEOUT)


def first_write_after(prober: Prober, since: float) -> float | None:
    """Seconds from ``since`` until the end of the prober's first acknowledged write begun after it."""
    ends = [
        c.started + c.seconds
        for c in list(prober.calls)
        if c.name == "put" and c.outcome == "ok" and c.started >= since
    ]
    return min(ends) - since if ends else None


def wait_write_after(prober: Prober, since: float, bound: float) -> float:
    """Wait (at most ``bound``) for the prober's first acknowledged write after ``since``; its delay."""
    deadline = time.monotonic() + bound
    while (stall := first_write_after(prober, since)) is None:
        assert time.monotonic() < deadline, f"no write acknowledged within {bound:g}s: {prober.calls[-5:]}"
        time.sleep(0.05)
    return stall
