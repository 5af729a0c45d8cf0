"""What the core re-reads a watched target with after a watch fired (``Backend.change_reader``).

The backend's own reads without the linearizing no-op write: ZooKeeper orders a
session's watch events and replies, so a plain read sent after the event sees
that change, and this session's reads never go back (the client reconnects only
to servers at least as recent as it has seen). A group's re-read takes the
listing the watch's re-arm already asked for (``membership.Groups.listed``).
"""

from __future__ import annotations

from consensus_api.model import Leadership, Versioned
from consensus_backends.zookeeper.election import Elections
from consensus_backends.zookeeper.membership import Groups
from consensus_backends.zookeeper.storage import Storage


class ChangeReader:
    """The backend's reads without the barrier (``ZooKeeperBackend.change_reader``)."""

    def __init__(self, storage: Storage, groups: Groups, elections: Elections) -> None:
        self._storage, self._groups, self._elections = storage, groups, elections

    def fetch(self, key: str) -> Versioned | None:
        return self._storage.fetch(key, linearizable=False)

    def keys(self, namespace: str) -> frozenset[str]:
        return self._storage.keys(namespace, linearizable=False)

    def membership(self, group: str) -> dict[str, bytes]:
        return self._groups.membership(group, linearizable=False)

    def leadership(self, service: str) -> Leadership | None:
        return self._elections.leadership(service, linearizable=False)
