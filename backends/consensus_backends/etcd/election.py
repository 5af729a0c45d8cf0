"""The etcd backend's leader election: a candidate is a key bound to the session's lease.

Guarantees:

* A candidate is a key created, bound to the session's lease, in one
  transaction that fails if the key exists (``lease.LeasedKeys``): a live
  candidate with that id is never replaced. Every candidate of a session
  vanishes with its lease.
* The oldest candidate (lowest ``create_revision``) leads and that revision is
  its term; ``nominate`` learns whether it leads in the same transaction. A
  fenced write checks that in its own transaction (``requests.fence_compares``).
* ``resign`` deletes the key only if this session's lease holds it; without a
  lease (the session was lost) the key is gone or soon will be.
"""

from __future__ import annotations

import time

from pyetcd import etcdrpc

from consensus_api.errors import MemberExistsError
from consensus_api.model import Leadership
from consensus_backends.etcd import requests as rq
from consensus_backends.etcd.client import EtcdClient
from consensus_backends.etcd.layout import Layout
from consensus_backends.etcd.lease import LeasedKeys


class Election:
    """The candidacies of one backend session; each call is bounded by ``request_timeout``."""

    def __init__(
        self, client: EtcdClient, layout: Layout, leased: LeasedKeys, request_timeout: float
    ) -> None:
        self._client = client
        self._layout = layout
        self._leased = leased
        self._timeout = request_timeout

    def nominate(self, service: str, candidate_id: str) -> bool:
        """Create the candidate key, bound to the lease; True if it is now the oldest candidate."""
        target = self._layout.candidate(service, candidate_id)
        find_oldest = etcdrpc.RequestOp(request_range=rq.oldest(self._layout.election(service)))
        response = self._leased.create(target, b"", [find_oldest])
        if not response.succeeded:
            raise MemberExistsError(f"service {service!r} already has a live candidate {candidate_id!r}")
        kvs = response.responses[1].response_range.kvs
        return bool(kvs) and kvs[0].key == target

    def resign(self, service: str, candidate_id: str) -> None:
        """Delete the candidate key if this session's lease holds it."""
        self._leased.release(
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

    def _deadline(self) -> float:
        return time.monotonic() + self._timeout
