"""The etcd backend's key-value operations: linearizable reads, one transaction per write.

Guarantees:

* Reads are linearizable (etcd's default); versions are ``mod_revision``
  values, so they strictly increase across updates, deletes and re-creates.
* Every conditional write is one transaction whose compares decide it; a
  failure branch reads back what is needed to name the error exactly. A fenced
  write compares the fence in the same transaction, and every write compares
  the seal (``requests``): on a sealed store it raises ``SealedError`` and is
  not applied.
* ``keys`` and ``walk`` read in pages at the first page's revision, so the
  pages form one snapshot (a compacted revision starts ``keys`` again; ``walk``
  goes on after the last key it yielded, at the newest revision).
"""

from __future__ import annotations

import time
from collections.abc import Generator, Iterator
from typing import Any, TypeVar

from pyetcd import etcdrpc

from consensus_api.errors import (
    ConsensusError,
    FencedError,
    KeyExistsError,
    KeyNotFoundError,
    SealedError,
    VersionConflictError,
)
from consensus_api.keys import join_key
from consensus_api.model import Leadership, Versioned
from consensus_backends.etcd import requests as rq
from consensus_backends.etcd.client import EtcdClient
from consensus_backends.etcd.errors import CompactedError
from consensus_backends.etcd.layout import Layout, prefix_end

#: Keys per page when listing a namespace.
PAGE_SIZE = 1000

#: Keys (with values) per page of ``walk``.
WALK_PAGE = 256

T = TypeVar("T")

#: An operation's logic without its I/O: it yields each request (a ``RangeRequest`` or a
#: ``TxnRequest``), is sent the response (or thrown the ``ConsensusError`` the call raised) and
#: returns the operation's result. ``Storage`` drives it with blocking calls, ``aio.AsyncStorage``
#: with awaited ones: one implementation of the rules, two kinds of I/O.
Steps = Generator[Any, Any, T]


class StorageSteps:
    """The key-value operations of one backend as ``Steps``: every request they make, and how each
    response decides the result or the error."""

    def __init__(self, layout: Layout) -> None:
        self._layout = layout
        self._fence_requests = rq.FenceRequests(layout)
        self._unsealed, self._seal_read = rq.unsealed(layout), rq.seal_read(layout)

    def fetch(self, key: str) -> Steps[Versioned | None]:
        """The value and ``mod_revision`` of ``key`` (a linearizable read)."""
        response = yield etcdrpc.RangeRequest(key=self._layout.key(key))
        for kv in response.kvs:  # one at most
            return Versioned(bytes(kv.value), int(kv.mod_revision))
        return None

    def put(self, key: str, value: bytes, fence: Leadership | None) -> Steps[int]:
        """Create ``key`` if ``create_revision == 0``; the new version is the transaction's revision."""
        target = self._layout.key(key)
        response = yield from self._write([rq.created_is(target, 0)], [rq.put(target, value)], [], fence)
        if not response.succeeded:
            raise KeyExistsError(f"key {key!r} already exists")
        return int(response.header.revision)

    def update(self, key: str, value: bytes, version: int | None, fence: Leadership | None) -> Steps[int]:
        """Replace the value if the key exists (and ``mod_revision == version`` when given)."""
        target = self._layout.key(key)
        response = yield from self._write(
            self._conditions(target, version), [rq.put(target, value)], [rq.read_meta(target)], fence
        )
        if not response.succeeded:
            self._raise_condition(key, version, response)
        return int(response.header.revision)

    def delete(self, key: str, version: int | None, fence: Leadership | None) -> Steps[None]:
        """Delete the key if it exists (and ``mod_revision == version`` when given)."""
        target = self._layout.key(key)
        response = yield from self._write(
            self._conditions(target, version), [rq.delete(target)], [rq.read_meta(target)], fence
        )
        if not response.succeeded:
            self._raise_condition(key, version, response)

    def keys(self, namespace: str) -> Steps[frozenset[str]]:
        """The keys one level below ``namespace``: a keys-only prefix scan, in pages at one revision.

        A page that ends inside a child's subtree continues after that whole
        subtree, so deep subtrees cost at most one page each.
        """
        prefix = self._layout.children(namespace)
        while True:
            try:
                children = yield from self._children(prefix)
            except CompactedError:  # compacted between two pages: start again at a newer revision
                continue
            return frozenset(join_key(namespace, child) for child in children)

    def _children(self, prefix: bytes) -> Steps[list[str]]:
        end = prefix_end(prefix)
        start, revision, children = prefix, 0, []
        while start < end:
            request = etcdrpc.RangeRequest(
                key=start, range_end=end, keys_only=True, limit=PAGE_SIZE, revision=revision
            )
            response = yield request
            revision = revision or int(response.header.revision)
            for kv in response.kvs:
                child, slash, _ = kv.key[len(prefix) :].partition(b"/")
                if not slash:
                    children.append(child.decode(errors="replace"))
            if not response.more or not response.kvs:
                break
            last = response.kvs[-1].key
            child, slash, _ = last[len(prefix) :].partition(b"/")
            start = prefix_end(prefix + child + b"/") if slash else last + b"\x00"
        return children

    def _write(
        self, compare: list[Any], success: list[Any], failure: list[Any], fence: Leadership | None
    ) -> Steps[Any]:
        """Run a conditional write; ``SealedError`` if the store is sealed, ``FencedError`` if ``fence``
        is not the current leadership. The caller's failure reads come first in the response."""
        seal_index = len(failure)
        compare, failure = [*compare, self._unsealed], [*failure, self._seal_read]
        if fence is not None:
            fence_compares, fence_read = self._fence_requests.get(fence)
            compare = compare + fence_compares
            failure = [*failure, fence_read]
        response = yield rq.txn(compare, success, failure)
        if not response.succeeded and rq.sealed_in(response.responses[seal_index]):
            raise SealedError(f"the etcd store {self._layout.root or '/'} is sealed by a migration")
        if (
            not response.succeeded
            and fence is not None
            and not rq.fence_held(self._layout, fence, response.responses[-1])
        ):
            raise FencedError(f"{fence.leader_id!r} no longer leads {fence.service!r} in term {fence.term}")
        return response

    @staticmethod
    def _conditions(target: bytes, version: int | None) -> list[Any]:
        compare = [rq.exists(target)]
        if version is not None:
            compare.append(rq.modified_is(target, version))
        return compare

    @staticmethod
    def _raise_condition(key: str, version: int | None, response: Any) -> None:
        kvs = response.responses[0].response_range.kvs
        if not kvs:
            raise KeyNotFoundError(f"key {key!r} does not exist")
        raise VersionConflictError(f"key {key!r} is at version {kvs[0].mod_revision}, not {version}")


class Storage:
    """The key-value operations of one backend (``StorageSteps``) over blocking calls; each call is
    bounded by ``request_timeout``."""

    def __init__(self, client: EtcdClient, layout: Layout, request_timeout: float) -> None:
        self._client = client
        self._layout = layout
        self._timeout = request_timeout
        self.steps = StorageSteps(layout)

    def fetch(self, key: str) -> Versioned | None:
        """See ``StorageSteps.fetch``."""
        return self._drive(self.steps.fetch(key))

    def put(self, key: str, value: bytes, fence: Leadership | None) -> int:
        """See ``StorageSteps.put``."""
        return self._drive(self.steps.put(key, value, fence))

    def update(self, key: str, value: bytes, version: int | None, fence: Leadership | None) -> int:
        """See ``StorageSteps.update``."""
        return self._drive(self.steps.update(key, value, version, fence))

    def delete(self, key: str, version: int | None, fence: Leadership | None) -> None:
        """See ``StorageSteps.delete``."""
        self._drive(self.steps.delete(key, version, fence))

    def keys(self, namespace: str) -> frozenset[str]:
        """See ``StorageSteps.keys``."""
        return self._drive(self.steps.keys(namespace))

    def _drive(self, steps: Steps[T]) -> T:
        """Run ``steps`` with blocking calls, all within one ``request_timeout``."""
        deadline = self._deadline()
        try:
            request = next(steps)
            while True:
                try:
                    if isinstance(request, etcdrpc.RangeRequest):
                        response = self._client.range(request, deadline)
                    else:
                        response = self._client.txn(request, deadline)
                except ConsensusError as exc:
                    request = steps.throw(exc)
                else:
                    request = steps.send(response)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]

    def walk(self, namespace: str) -> Iterator[tuple[str, Versioned]]:
        """A prefix range in pages of ``WALK_PAGE`` keys, all at the first page's revision.

        So the pages form one snapshot, unless that revision is compacted
        meanwhile: the walk then goes on after the last key yielded, at the
        newest revision.
        """
        prefix = self._layout.children(namespace)
        strip = len(self._layout.key(""))
        start, end, revision = prefix, prefix_end(prefix), 0
        while start < end:
            request = etcdrpc.RangeRequest(key=start, range_end=end, limit=WALK_PAGE, revision=revision)
            try:
                response = self._client.range(request, self._deadline())
            except CompactedError:
                revision = 0
                continue
            revision = revision or int(response.header.revision)
            for kv in response.kvs:
                yield (
                    kv.key[strip:].decode(errors="replace"),
                    Versioned(bytes(kv.value), int(kv.mod_revision)),
                )
            if not response.more or not response.kvs:
                return
            start = response.kvs[-1].key + b"\x00"

    def _deadline(self) -> float:
        return time.monotonic() + self._timeout
