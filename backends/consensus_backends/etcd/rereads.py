"""What the core re-reads a watched target with after etcd reported it changed.

A value's re-read uses the watch event itself where it can: an event carries
the key's exact state at its revision (value and ``mod_revision``, or the
delete), and any later change of the key has a later event on the same
stream, which is stored before it is reported and reported again. So the
latest event of a key is at least the change reported, and the listener
converges. It is used only if its revision is at least the highest revision any
read of this session returned (``EtcdClient.read_revision``), so it never shows
less than an earlier read saw; otherwise, and for the other targets, the read
is the backend's linearizable one. One round trip less per change.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from consensus_api.model import Leadership, Versioned

if TYPE_CHECKING:
    from consensus_backends.etcd.changes import PrefixWatch
    from consensus_backends.etcd.client import EtcdClient
    from consensus_backends.etcd.election import Election
    from consensus_backends.etcd.membership import Membership
    from consensus_backends.etcd.storage import Storage


class ChangeReader:
    """The backend's reads, with a value's re-read answered by its latest watch event."""

    def __init__(
        self,
        storage: Storage,
        membership: Membership,
        election: Election,
        client: EtcdClient,
        watch: PrefixWatch,
    ) -> None:
        self._storage = storage
        self._membership = membership
        self._election = election
        self._client = client
        self._watch = watch

    def fetch(self, key: str) -> Versioned | None:
        seen = self._watch.value(key)
        if seen is None or seen[0] < self._client.read_revision:
            return self._storage.fetch(key)
        revision, value = seen
        return None if value is None else Versioned(value, revision)

    def keys(self, namespace: str) -> frozenset[str]:
        return self._storage.keys(namespace)

    def membership(self, group: str) -> dict[str, bytes]:
        return self._membership.membership(group)

    def leadership(self, service: str) -> Leadership | None:
        return self._election.leadership(service)
