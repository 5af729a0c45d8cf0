"""Leader election: ephemeral sequential candidates, the lowest leads, its czxid is the term.

Guarantees:

* Candidate ids are unique among live candidates: the claim znode
  ``ids/<id>`` and the queue znode are created in one transaction.
* Sequence numbers grow with creation order and a queue znode never comes
  back once deleted, so a candidate that was the lowest stays the lowest for
  as long as its znode exists. Each new leader's znode was created after the
  previous leader's, so terms (czxids) strictly increase.
* A fenced write is one transaction that checks the leader's queue znode
  (version 0: it is never modified) next to the write: it commits only while
  that leadership is current. When the session has not been answered lately
  (this process may have been frozen past its session timeout), the read that
  finds the leader takes a quorum barrier first: on an expired session it
  fails, and the write is never sent (the core reports ``FencedError``).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError, NoNodeError
from kazoo.protocol.states import ZnodeStat

from consensus_api.errors import (
    ConsensusError,
    FencedError,
    MemberExistsError,
    NotAMemberError,
    OperationTimeoutError,
)
from consensus_api.model import Leadership
from consensus_backends.zookeeper import steps
from consensus_backends.zookeeper.layout import Layout, candidate_id_of, sequence_of
from consensus_backends.zookeeper.lease import Connection
from consensus_backends.zookeeper.steps import Steps
from consensus_backends.zookeeper.txn import Op, Txn, check, check_deadline, create, delete, ensure

CZXID_CACHE = 4096


class Elections:
    """The election operations of one backend."""

    def __init__(self, connection: Connection, layout: Layout, timeout: float) -> None:
        self._connection = connection
        self._layout = layout
        self._timeout = timeout
        self._lock = threading.Lock()
        self._own: dict[tuple[str, str], tuple[str, str]] = {}
        self._czxids: OrderedDict[str, int] = OrderedDict()

    def nominate(self, service: str, candidate_id: str) -> bool:
        """Queue ``candidate_id``; True if it leads now. ``MemberExistsError`` if the id is taken."""
        deadline = time.monotonic() + self._timeout
        claim = self._layout.claim(service, candidate_id)
        while True:
            check_deadline(deadline, "nominate")
            txn = Txn()
            txn.add("claim", create(claim, ephemeral=True))
            txn.add(
                "queue",
                create(self._layout.candidate_prefix(service, candidate_id), ephemeral=True, sequence=True),
            )
            try:
                results, role, error = txn.commit(self._connection, deadline)
            except OperationTimeoutError:
                path = self._find_own(service, candidate_id, deadline)
                if path is None:
                    raise
                break
            if error is None:
                path = str(results[1])
                break
            if role == "claim" and isinstance(error, NodeExistsError):
                self._connection.refuse_if_ghost(claim, deadline)
                raise MemberExistsError(f"a live candidate of {service!r} has the id {candidate_id!r}")
            if not isinstance(error, NoNodeError):
                raise ConsensusError(f"nominate failed in ZooKeeper: {type(error).__name__}")
            election = self._layout.election(service)
            ensure(self._connection, [election, f"{election}/ids", self._layout.queue(service)], deadline)
        with self._lock:
            self._own[(service, candidate_id)] = (path, claim)
        leader = self._lowest(service, deadline, barrier=False, own=path)
        return leader is not None and leader[0] == path

    def resign(self, service: str, candidate_id: str) -> None:
        """Withdraw this backend's candidate; ``NotAMemberError`` if it never nominated it.

        A candidate already gone with a lost session counts as withdrawn.
        """
        deadline = time.monotonic() + self._timeout
        with self._lock:
            own = self._own.get((service, candidate_id))
        if own is None:
            raise NotAMemberError(f"this session has no candidate {candidate_id!r} for {service!r}")
        path, claim = own
        txn = Txn()
        txn.add("queue", delete(path))  # checked first: the claim is ours only while our queue znode lives
        txn.add("claim", delete(claim))
        _, _, error = txn.commit(self._connection, deadline)
        if error is not None and not isinstance(error, NoNodeError):
            raise ConsensusError(f"resign failed in ZooKeeper: {type(error).__name__}")
        with self._lock:
            if self._own.get((service, candidate_id)) == own:
                del self._own[(service, candidate_id)]

    def leadership(self, service: str, *, linearizable: bool = True) -> Leadership | None:
        """The current leader and term, read linearizably (else in this session's order)."""
        deadline = time.monotonic() + self._timeout
        leader = self._lowest(service, deadline, barrier=linearizable)
        if leader is None:
            return None
        _, candidate_id, term = leader
        return Leadership(service, candidate_id, term)

    def fence(self, fence: Leadership, deadline: float) -> Steps[Op]:
        """The check that makes a transaction commit only while ``fence`` is the current leadership.

        ``FencedError`` if it is not current now (confirmed by a linearizable read). The first read
        is answered from the connected server's copy, which may lag behind the quorum, unless this
        session has not been answered lately: then it takes the barrier too, a quorum write that
        also fails if the session expired meanwhile (this process frozen past its session timeout,
        its leadership handed over), so the write is not sent on a session the server has closed.
        """
        for barrier in (False, True) if self._connection.answered_lately() else (True,):
            leader = yield from self._finding_lowest(fence.service, deadline, barrier=barrier)
            if leader is not None and leader[1:] == (fence.leader_id, fence.term):
                return check(leader[0], 0)
        raise FencedError(
            f"the leadership of {fence.leader_id!r} (term {fence.term}) over {fence.service!r} is not current"
        )

    def _find_own(self, service: str, candidate_id: str, deadline: float) -> str | None:
        """After a nomination of unknown effect: this session's queue znode for ``candidate_id``, if it
        exists (read once the connection is back, if time is left)."""
        queue = self._layout.queue(service)
        try:
            [names] = self._connection.read(
                lambda client: [client.get_children_async(queue)], deadline, barrier=None
            )
            mine = [
                f"{queue}/{name}"
                for name in ([] if isinstance(names, Exception) else names)
                if candidate_id_of(name) == candidate_id
            ]
            stats = self._connection.read(
                lambda client: [client.exists_async(path) for path in mine], deadline, barrier=None
            )
        except OperationTimeoutError:
            return None
        owned = [path for path, stat in zip(mine, stats, strict=True) if self._connection.owns(stat)]
        return owned[0] if owned else None

    def _lowest(
        self, service: str, deadline: float, *, barrier: bool, own: str | None = None
    ) -> tuple[str, str, int] | None:
        """The lowest candidate's znode path, id and czxid, or None without candidates.

        ``own``: a queue znode just created, whose czxid is read along with the children, so that
        the read that finds it leading (after a handoff) needs no second round trip.
        """
        return steps.drive(
            self._connection, self._finding_lowest(service, deadline, barrier=barrier, own=own), deadline
        )

    def _finding_lowest(
        self, service: str, deadline: float, *, barrier: bool, own: str | None = None
    ) -> Steps[tuple[str, str, int] | None]:
        """``_lowest`` as steps."""
        queue = self._layout.queue(service)

        def children(client: KazooClient) -> list[Any]:
            return [client.get_children_async(queue), *([client.exists_async(own)] if own else [])]

        while True:
            check_deadline(deadline, "reading the election")
            names, *stat = yield from steps.send(
                children, barrier=self._layout.barrier_path if barrier else None
            )
            if own is not None and stat and isinstance(stat[0], ZnodeStat):
                self._remember(own, int(stat[0].czxid))
            if isinstance(names, NoNodeError):
                return None
            candidates = [name for name in names if candidate_id_of(name) is not None]
            if not candidates:
                return None
            name = min(candidates, key=lambda each: sequence_of(each) or 0)
            path = f"{queue}/{name}"
            term = yield from self._czxid(path)
            if term is not None:
                return path, str(candidate_id_of(name)), term

    def _czxid(self, path: str) -> Steps[int | None]:
        """The creation zxid of a queue znode (cached: it never changes), or None if it is gone."""
        with self._lock:
            cached = self._czxids.get(path)
        if cached is not None:
            return cached
        [stat] = yield from steps.send(lambda client: [client.exists_async(path)])
        if stat is None:
            return None
        czxid = int(stat.czxid)
        self._remember(path, czxid)
        return czxid

    def _remember(self, path: str, czxid: int) -> None:
        with self._lock:
            self._czxids[path] = czxid
            while len(self._czxids) > CZXID_CACHE:
                self._czxids.popitem(last=False)
