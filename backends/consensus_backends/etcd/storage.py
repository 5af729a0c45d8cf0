"""The etcd backend's key-value operations: linearizable reads, one transaction per write.

Guarantees:

* Reads are linearizable (etcd's default); versions are ``mod_revision``
  values, so they strictly increase across updates, deletes and re-creates.
* Every conditional write is one transaction whose compares decide it; a
  failure branch reads back what is needed to name the error exactly. A fenced
  write compares the fence in the same transaction (``requests``).
* ``keys`` and ``walk`` read in pages at the first page's revision, so the
  pages form one snapshot (a compacted revision starts ``keys`` again; ``walk``
  goes on after the last key it yielded, at the newest revision).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from pyetcd import etcdrpc

from consensus_api.errors import FencedError, KeyExistsError, KeyNotFoundError, VersionConflictError
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


class Storage:
    """The key-value operations of one backend; each call is bounded by ``request_timeout``."""

    def __init__(self, client: EtcdClient, layout: Layout, request_timeout: float) -> None:
        self._client = client
        self._layout = layout
        self._timeout = request_timeout
        self._fence_requests = rq.FenceRequests(layout)

    def fetch(self, key: str) -> Versioned | None:
        """The value and ``mod_revision`` of ``key`` (a linearizable read)."""
        response = self._client.range(etcdrpc.RangeRequest(key=self._layout.key(key)), self._deadline())
        for kv in response.kvs:  # one at most
            return Versioned(bytes(kv.value), int(kv.mod_revision))
        return None

    def put(self, key: str, value: bytes, fence: Leadership | None) -> int:
        """Create ``key`` if ``create_revision == 0``; the new version is the transaction's revision."""
        target = self._layout.key(key)
        response = self._write([rq.created_is(target, 0)], [rq.put(target, value)], [], fence)
        if not response.succeeded:
            raise KeyExistsError(f"key {key!r} already exists")
        return int(response.header.revision)

    def update(self, key: str, value: bytes, version: int | None, fence: Leadership | None) -> int:
        """Replace the value if the key exists (and ``mod_revision == version`` when given)."""
        target = self._layout.key(key)
        response = self._write(
            self._conditions(target, version), [rq.put(target, value)], [rq.read_meta(target)], fence
        )
        if not response.succeeded:
            self._raise_condition(key, version, response)
        return int(response.header.revision)

    def delete(self, key: str, version: int | None, fence: Leadership | None) -> None:
        """Delete the key if it exists (and ``mod_revision == version`` when given)."""
        target = self._layout.key(key)
        response = self._write(
            self._conditions(target, version), [rq.delete(target)], [rq.read_meta(target)], fence
        )
        if not response.succeeded:
            self._raise_condition(key, version, response)

    def keys(self, namespace: str) -> frozenset[str]:
        """The keys one level below ``namespace``: a keys-only prefix scan, in pages at one revision.

        A page that ends inside a child's subtree continues after that whole
        subtree, so deep subtrees cost at most one page each.
        """
        prefix = self._layout.children(namespace)
        deadline = self._deadline()
        while True:
            try:
                children = self._children(prefix, deadline)
            except CompactedError:  # compacted between two pages: start again at a newer revision
                continue
            return frozenset(join_key(namespace, child) for child in children)

    def _children(self, prefix: bytes, deadline: float) -> list[str]:
        end = prefix_end(prefix)
        start, revision, children = prefix, 0, []
        while start < end:
            request = etcdrpc.RangeRequest(
                key=start, range_end=end, keys_only=True, limit=PAGE_SIZE, revision=revision
            )
            response = self._client.range(request, deadline)
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

    def _write(
        self, compare: list[Any], success: list[Any], failure: list[Any], fence: Leadership | None
    ) -> Any:
        """Run a conditional write; ``FencedError`` if ``fence`` is not the current leadership."""
        if fence is not None:
            fence_compares, fence_read = self._fence_requests.get(fence)
            compare = compare + fence_compares
            failure = [*failure, fence_read]
        response = self._client.txn(rq.txn(compare, success, failure), self._deadline())
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
