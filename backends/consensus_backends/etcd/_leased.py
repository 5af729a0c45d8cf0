"""The etcd backend's group membership and leader election: keys bound to the session's lease.

Guarantees:

* A member or candidate is a key created, bound to the session's lease
  (``_lease``), in one transaction that fails if the key exists: a live member
  or candidate with that id is never replaced. All of them vanish with the lease.
* The oldest candidate (lowest ``create_revision``) leads and that revision is
  its term; ``nominate`` learns whether it leads in the same transaction.
* ``leave`` and ``resign`` delete a key only if this session's lease holds it;
  without a lease (the session was lost) the key is gone or soon will be.
* The session's own keys are remembered, so the watch's report that one was
  deleted wakes the lease keeper at once (a revoked lease is noticed in milliseconds).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from pyetcd import etcdrpc

from consensus_api.errors import MemberExistsError, NotAMemberError, SessionLostError
from consensus_api.model import Leadership
from consensus_backends.etcd import _requests as rq
from consensus_backends.etcd._client import EtcdClient
from consensus_backends.etcd._layout import Layout, prefix_end
from consensus_backends.etcd._lease import LeaseKeeper


class LeasedKeys:
    """The members and candidates of one backend; each call is bounded by ``request_timeout``."""

    def __init__(
        self, client: EtcdClient, layout: Layout, keeper: LeaseKeeper, request_timeout: float
    ) -> None:
        self._client = client
        self._layout = layout
        self._keeper = keeper
        self._timeout = request_timeout
        self._lock = threading.Lock()
        self._owned: set[bytes] = set()

    # Group membership

    def join(self, group: str, member_id: str, data: bytes) -> None:
        """Create the member key, bound to the lease, if no key has that id."""
        target = self._layout.member(group, member_id)
        if not self._create_leased(target, data, []).succeeded:
            raise MemberExistsError(f"group {group!r} already has a live member {member_id!r}")

    def leave(self, group: str, member_id: str) -> None:
        """Delete the member key if this session's lease holds it."""
        self._release(self._layout.member(group, member_id), f"member {member_id!r} of group {group!r}")

    def membership(self, group: str) -> dict[str, bytes]:
        """The member keys of ``group`` and their data."""
        prefix = self._layout.group(group)
        request = etcdrpc.RangeRequest(key=prefix, range_end=prefix_end(prefix))
        response = self._client.range(request, self._deadline())
        return {kv.key[len(prefix) :].decode(errors="replace"): bytes(kv.value) for kv in response.kvs}

    # Leader election

    def nominate(self, service: str, candidate_id: str) -> bool:
        """Create the candidate key, bound to the lease; True if it is now the oldest candidate."""
        target = self._layout.candidate(service, candidate_id)
        find_oldest = etcdrpc.RequestOp(request_range=rq.oldest(self._layout.election(service)))
        response = self._create_leased(target, b"", [find_oldest])
        if not response.succeeded:
            raise MemberExistsError(f"service {service!r} already has a live candidate {candidate_id!r}")
        kvs = response.responses[1].response_range.kvs
        return bool(kvs) and kvs[0].key == target

    def resign(self, service: str, candidate_id: str) -> None:
        """Delete the candidate key if this session's lease holds it."""
        self._release(
            self._layout.candidate(service, candidate_id), f"candidate {candidate_id!r} for {service!r}"
        )

    def leadership(self, service: str) -> Leadership | None:
        """The oldest candidate and its ``create_revision`` (the term), or None."""
        prefix = self._layout.election(service)
        response = self._client.range(rq.oldest(prefix), self._deadline())
        if not response.kvs:
            return None
        leader = response.kvs[0]
        return Leadership(
            service, leader.key[len(prefix) :].decode(errors="replace"), int(leader.create_revision)
        )

    # The session's own keys

    def forget(self) -> None:
        """The lease was lost: none of the keys it held is this session's any more."""
        with self._lock:
            self._owned.clear()

    def deleted(self, key: bytes) -> None:
        """From the watch: ``key`` vanished; if it was ours, perhaps with our lease: check it now."""
        with self._lock:
            ours = key in self._owned
        if ours:
            self._keeper.check_now()

    def _deadline(self) -> float:
        return time.monotonic() + self._timeout

    def _create_leased(self, target: bytes, value: bytes, then: list[Any]) -> Any:
        """Create ``target`` bound to the session's lease if it does not exist; runs ``then`` too."""
        lease = self._keeper.current()
        request = rq.txn([rq.created_is(target, 0)], [rq.put(target, value, lease), *then], [])
        try:
            response = self._client.txn(request, self._deadline())
        except SessionLostError:
            self._keeper.check_now()
            raise
        if response.succeeded:
            with self._lock:
                self._owned.add(target)
        return response

    def _release(self, target: bytes, what: str) -> None:
        """Delete ``target`` if it is bound to the session's lease.

        Without a lease (the session was lost) the key is gone or will be gone
        before a new lease exists, and so is a key found missing: both count as
        released. A key held by another session is ``NotAMemberError``.
        """
        with self._lock:
            self._owned.discard(target)
        lease = self._keeper.held()
        if lease is None:
            return
        request = rq.txn([rq.leased_by(target, lease)], [rq.delete(target)], [rq.read_meta(target)])
        response = self._client.txn(request, self._deadline())
        if not response.succeeded and response.responses[0].response_range.kvs:
            raise NotAMemberError(f"{what} is held by another session")
