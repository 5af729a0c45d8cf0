"""etcd v3 request messages (pyetcd's generated ``etcdrpc``) for the backend's transactions.

The fence: a ``Leadership(service, leader_id, term)`` is current exactly when
the candidate key of ``leader_id`` exists with ``create_revision == term`` and
no candidate key of the service has a lower ``create_revision`` (the oldest
candidate leads). As two compares of one transaction:

* ``create_revision(candidate key) == term``, and
* ``create_revision > term - 1`` for every key of the service's candidate range.

Keys are never created with a past revision, so once the leader's key is gone
the fence can never hold again, and a key with a lower revision that still
exists makes the fence fail.

The seal: every storage write's transaction also compares

* ``create_revision(P/migration/seal) == 0`` (the seal key does not exist),

and its failure branch reads that key. etcd applies transactions one at a
time, each at its own revision; ``seal`` creates the key at revision S. A
write applied before S was applied before the seal; one evaluated after S
finds the key, fails that compare and applies nothing, and its failure branch
shows the key: ``SealedError``. ``unseal`` deletes the key, and the compare
holds again. It costs one compare in a transaction the write sends anyway.
"""

from __future__ import annotations

from typing import Any

from pyetcd import etcdrpc

from consensus_api.errors import FencedError
from consensus_api.model import Leadership
from consensus_backends.etcd.layout import Layout, prefix_end

Compare = etcdrpc.Compare


def created_is(key: bytes, revision: int) -> Any:
    """``create_revision(key) == revision`` (0: the key does not exist)."""
    return Compare(key=key, target=Compare.CREATE, result=Compare.EQUAL, create_revision=revision)


def exists(key: bytes) -> Any:
    """The key exists."""
    return Compare(key=key, target=Compare.CREATE, result=Compare.GREATER, create_revision=0)


def modified_is(key: bytes, revision: int) -> Any:
    """``mod_revision(key) == revision``."""
    return Compare(key=key, target=Compare.MOD, result=Compare.EQUAL, mod_revision=revision)


def leased_by(key: bytes, lease: int) -> Any:
    """The key exists and is bound to ``lease``."""
    return Compare(key=key, target=Compare.LEASE, result=Compare.EQUAL, lease=lease)


def put(key: bytes, value: bytes, lease: int = 0) -> Any:
    """Write ``value`` (bound to ``lease`` unless 0)."""
    return etcdrpc.RequestOp(request_put=etcdrpc.PutRequest(key=key, value=value, lease=lease))


def delete(key: bytes) -> Any:
    """Delete one key."""
    return etcdrpc.RequestOp(request_delete_range=etcdrpc.DeleteRangeRequest(key=key))


def read_meta(key: bytes) -> Any:
    """Read one key's revisions (not its value)."""
    return etcdrpc.RequestOp(request_range=etcdrpc.RangeRequest(key=key, keys_only=True))


def oldest(prefix: bytes) -> Any:
    """A RangeRequest for the key with the lowest create_revision under ``prefix`` (keys only)."""
    return etcdrpc.RangeRequest(
        key=prefix,
        range_end=prefix_end(prefix),
        limit=1,
        keys_only=True,
        sort_order=etcdrpc.RangeRequest.ASCEND,
        sort_target=etcdrpc.RangeRequest.CREATE,
    )


def txn(compare: list[Any], success: list[Any], failure: list[Any]) -> Any:
    """A TxnRequest."""
    return etcdrpc.TxnRequest(compare=compare, success=success, failure=failure)


def unsealed(layout: Layout) -> Any:
    """The compare that holds while the store is not sealed."""
    return created_is(layout.seal, 0)


def seal_read(layout: Layout) -> Any:
    """A failure-branch read of the seal key (see ``sealed_in``)."""
    return etcdrpc.RequestOp(request_range=etcdrpc.RangeRequest(key=layout.seal, keys_only=True))


def sealed_in(response: Any) -> bool:
    """Whether ``seal_read``'s response found the store sealed."""
    return bool(response.response_range.kvs)


def fence_compares(layout: Layout, fence: Leadership) -> list[Any]:
    """The compares that hold exactly while ``fence`` is the current leadership (``fence.term`` >= 1)."""
    candidates = layout.election(fence.service)
    return [
        created_is(layout.candidate(fence.service, fence.leader_id), fence.term),
        Compare(
            key=candidates,
            range_end=prefix_end(candidates),
            target=Compare.CREATE,
            result=Compare.GREATER,
            create_revision=fence.term - 1,
        ),
    ]


def fence_read(layout: Layout, fence: Leadership) -> Any:
    """A failure-branch read that tells whether the fence held (see ``fence_held``)."""
    return etcdrpc.RequestOp(request_range=oldest(layout.election(fence.service)))


def fence_held(layout: Layout, fence: Leadership, response: Any) -> bool:
    """Whether the oldest candidate in ``fence_read``'s response is the fence's leader and term."""
    kvs = response.response_range.kvs
    return (
        bool(kvs)
        and kvs[0].key == layout.candidate(fence.service, fence.leader_id)
        and (kvs[0].create_revision == fence.term)
    )


class FenceRequests:
    """``fence_compares`` and ``fence_read`` of recent fences, built once per fence: a leader writes
    with the same fence many times, and the messages are copied into each request, never changed."""

    #: Fences kept (all are dropped when more come).
    KEPT = 64

    def __init__(self, layout: Layout) -> None:
        self._layout = layout
        self._kept: dict[Leadership, tuple[list[Any], Any]] = {}

    def get(self, fence: Leadership) -> tuple[list[Any], Any]:
        """The compares and the failure-branch read of ``fence``; ``FencedError`` for a term below 1."""
        requests = self._kept.get(fence)
        if requests is None:
            if fence.term < 1:
                raise FencedError(f"term {fence.term} of {fence.service!r} was never current")
            requests = fence_compares(self._layout, fence), fence_read(self._layout, fence)
            if len(self._kept) >= self.KEPT:
                self._kept.clear()
            self._kept[fence] = requests
        return requests
