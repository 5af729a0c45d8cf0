"""A migration's seal of the store, the terms it has issued, and its live sessions.

Where they live: ``layout`` (``P/migration/seal``, ``P/migration/sessions/<lease>``).

Guarantees:

* The seal is the existence of the seal key; every storage write compares it
  in its own transaction (the proof: ``requests``). ``seal`` creates it (only
  where it is missing, so sealing twice changes nothing), ``unseal`` deletes
  it; ``sealed`` is a linearizable read of it. Absent means unsealed, so a
  store an earlier version created is unsealed as it is.
* ``term_ceiling`` is the revision in the header of a linearizable read: terms
  are ``create_revision``\\ s of candidate keys, all at most the revision the
  cluster has reached, and that revision never goes down.
* Sessions: each lease gets a key under ``sessions/`` named by its id (hex),
  bound to it and written before the lease is used (``announce``, at ``open``
  and for every replacing lease), so the key exists while the lease lives and
  vanishes with it: revoked by ``close``, or expired. etcd's own lease listing
  (``LeaseLeases``) would name every lease of the cluster, other prefixes' and
  other applications' included, and the client library does not offer it.
"""

from __future__ import annotations

import time

from pyetcd import etcdrpc

from consensus_api.errors import ConsensusError
from consensus_backends.etcd import requests as rq
from consensus_backends.etcd.client import EtcdClient
from consensus_backends.etcd.layout import Layout, prefix_end

#: The seal key's value (its existence is what counts).
SEALED = b"sealed"


class Seal:
    """The seal, the term ceiling and the sessions' keys of one backend prefix; each call is one
    request, bounded by ``request_timeout``."""

    def __init__(self, client: EtcdClient, layout: Layout, request_timeout: float) -> None:
        self._client = client
        self._layout = layout
        self._timeout = request_timeout

    def seal(self) -> None:
        """Create the seal key where it is missing."""
        seal = self._layout.seal
        self._client.txn(rq.txn([rq.created_is(seal, 0)], [rq.put(seal, SEALED)], []), self._deadline())

    def unseal(self) -> None:
        """Delete the seal key."""
        self._client.txn(rq.txn([], [rq.delete(self._layout.seal)], []), self._deadline())

    def sealed(self) -> bool:
        """Whether the seal key exists (a linearizable read)."""
        request = etcdrpc.RangeRequest(key=self._layout.seal, count_only=True)
        return int(self._client.range(request, self._deadline()).count) > 0

    def term_ceiling(self) -> int:
        """The cluster's revision, from a linearizable read."""
        return self._client.revision(self._layout.seal, self._deadline())

    def announce(self, lease: int, deadline: float) -> None:
        """Write the key of the session holding ``lease``, bound to it."""
        key = self._layout.sessions + identity(lease).encode()
        response = self._client.txn(rq.txn([], [rq.put(key, b"", lease)], []), deadline)
        if not response.succeeded:
            raise ConsensusError("etcd did not write the session's key")

    def live_sessions(self) -> frozenset[str]:
        """The ids of the leases whose session keys exist (a linearizable read)."""
        prefix = self._layout.sessions
        request = etcdrpc.RangeRequest(key=prefix, range_end=prefix_end(prefix), keys_only=True)
        response = self._client.range(request, self._deadline())
        return frozenset(kv.key[len(prefix) :].decode() for kv in response.kvs)

    def _deadline(self) -> float:
        return time.monotonic() + self._timeout


def identity(lease: int) -> str:
    """How a session is named: its lease id in hex, as ``etcdctl lease list`` shows it."""
    return f"{lease:x}"
