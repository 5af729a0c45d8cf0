"""Key-value storage on marker and anchor znodes (where they live: ``layout``).

Guarantees:

* A key exists exactly while its marker does; marker and anchor change in one
  transaction, so ``keys()`` (one ``get_children``) and ``fetch`` (one
  ``get`` of the anchor) agree.
* The version is the anchor's ``mzxid``: it strictly increases across
  updates, deletes and re-creates, because the anchor is never deleted.
* A compare-and-set checks the anchor's ``stat.version``, read after the
  expected ``mzxid`` was confirmed; since the anchor is never re-created, that
  version cannot come back (no ABA).
* Reads (``fetch``, ``keys``) are linearizable: a no-op quorum write goes first
  on the same session. Failing conditions found by a plain read are confirmed
  by a linearizable one before an error is raised.
* ``fence=`` adds the leader check to the same transaction.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from consensus_api.errors import (
    ConsensusError,
    FencedError,
    KeyExistsError,
    KeyNotFoundError,
    VersionConflictError,
)
from consensus_api.keys import join_key, parent_of
from consensus_api.model import Leadership, Versioned
from consensus_backends.zookeeper import payload
from consensus_backends.zookeeper.election import Elections
from consensus_backends.zookeeper.layout import CHUNK_PREFIX, MARKER, Layout, decode_name
from consensus_backends.zookeeper.lease import Connection
from consensus_backends.zookeeper.txn import (
    KnownPaths,
    Txn,
    check,
    check_deadline,
    create,
    delete,
    ensure,
    set_data,
)

log = logging.getLogger("consensus_api.zookeeper")


class Storage:
    """The storage operations of one backend."""

    def __init__(self, connection: Connection, layout: Layout, elections: Elections, timeout: float) -> None:
        self._connection = connection
        self._layout = layout
        self._elections = elections
        self._timeout = timeout
        self._anchors = KnownPaths()

    def fetch(self, key: str, *, linearizable: bool = True) -> Versioned | None:
        """The value and version of ``key``, read linearizably (else in this session's order)."""
        deadline = time.monotonic() + self._timeout
        anchor = self._layout.anchor(key)
        barrier = self._layout.barrier_path if linearizable else None
        while True:
            check_deadline(deadline, "fetch")
            [found] = self._connection.read(
                lambda client: [client.get_async(anchor)], deadline, barrier=barrier
            )
            if isinstance(found, NoNodeError) or not found[0]:
                return None
            data, stat = found
            value = payload.decode(self._connection, anchor, data, deadline)
            if value is not None:
                return Versioned(value, int(stat.mzxid))

    def keys(self, namespace: str, *, linearizable: bool = True) -> frozenset[str]:
        """The keys one level below ``namespace``, read linearizably (else in this session's order)."""
        deadline = time.monotonic() + self._timeout
        directory = self._layout.directory(namespace)
        barrier = self._layout.barrier_path if linearizable else None
        [names] = self._connection.read(
            lambda client: [client.get_children_async(directory)], deadline, barrier=barrier
        )
        if isinstance(names, NoNodeError):
            return frozenset()
        return frozenset(
            join_key(namespace, decode_name(name[len(MARKER) :])) for name in names if name.startswith(MARKER)
        )

    def put(self, key: str, value: bytes, fence: Leadership | None) -> int:
        """Create ``key``; ``KeyExistsError`` if it exists."""
        deadline = time.monotonic() + self._timeout
        encoded = payload.encode(value)
        marker, anchor = self._layout.key_paths(key)
        chunks: list[str] = []
        try:
            while True:
                check_deadline(deadline, "put")
                if encoded.chunks and not chunks:
                    self._ensure_anchor(key, deadline)
                    chunks = self._write_chunks(anchor, encoded.chunks, deadline)
                txn = self._start(fence, anchor, chunks, deadline)
                txn.add("marker", create(marker))
                if anchor not in self._anchors:
                    txn.add("new anchor", create(anchor))
                txn.add("anchor", set_data(anchor, payload.publish(chunks) if chunks else encoded.data))
                results, role, error = txn.commit(self._connection, deadline)
                if error is None:
                    self._anchors.add(anchor)
                    return self._written(anchor, results[-1], chunks, deadline)
                if role == "marker" and isinstance(error, NodeExistsError):
                    raise KeyExistsError(f"key {key!r} already exists")
                if role == "marker" and isinstance(error, NoNodeError):
                    ensure(self._connection, self._layout.directories(parent_of(key)), deadline)
                elif role == "new anchor" and isinstance(error, NodeExistsError):
                    self._anchors.add(anchor)
                elif role == "anchor" and isinstance(error, NoNodeError):
                    self._anchors.discard(anchor)
                else:
                    chunks = self._retry(role, error, fence, chunks)
        except (KeyExistsError, FencedError):
            self._drop_chunks(anchor, chunks, deadline)
            raise

    def update(self, key: str, value: bytes, version: int | None, fence: Leadership | None) -> int:
        """Replace the value of ``key`` (at ``version`` when given)."""
        deadline = time.monotonic() + self._timeout
        encoded = payload.encode(value)
        marker, anchor = self._layout.key_paths(key)
        chunks: list[str] = []
        try:
            while True:
                check_deadline(deadline, "update")
                if encoded.chunks and not chunks:
                    chunks = self._write_chunks(anchor, encoded.chunks, deadline, key=key)
                txn = self._start(fence, anchor, chunks, deadline)
                data = payload.publish(chunks) if chunks else encoded.data
                if version is None:
                    txn.add("marker", check(marker, -1))
                    txn.add("anchor", set_data(anchor, data))
                else:
                    txn.add("anchor", set_data(anchor, data, self._anchor_version(key, version, deadline)))
                results, role, error = txn.commit(self._connection, deadline)
                if error is None:
                    return self._written(anchor, results[-1], chunks, deadline)
                if isinstance(error, NoNodeError) and role in ("marker", "anchor"):
                    raise KeyNotFoundError(f"key {key!r} does not exist")
                chunks = self._retry(role, error, fence, chunks)
        except (KeyNotFoundError, VersionConflictError, FencedError):
            self._drop_chunks(anchor, chunks, deadline)
            raise

    def delete(self, key: str, version: int | None, fence: Leadership | None) -> None:
        """Remove ``key`` (at ``version`` when given); its anchor stays, emptied."""
        deadline = time.monotonic() + self._timeout
        marker, anchor = self._layout.key_paths(key)
        while True:
            check_deadline(deadline, "delete")
            txn = self._start(fence, anchor, [], deadline)
            expected = -1 if version is None else self._anchor_version(key, version, deadline)
            txn.add("marker", delete(marker))
            txn.add("anchor", set_data(anchor, b"", expected))
            results, role, error = txn.commit(self._connection, deadline)
            if error is None:
                self._written(anchor, results[-1], [], deadline)
                return
            if isinstance(error, NoNodeError) and role in ("marker", "anchor"):
                raise KeyNotFoundError(f"key {key!r} does not exist")
            self._retry(role, error, fence, [])

    # Helpers

    def _start(self, fence: Leadership | None, anchor: str, chunks: list[str], deadline: float) -> Txn:
        """A transaction holding the fence check and the checks that ``chunks`` still exist."""
        txn = Txn()
        if fence is not None:
            txn.add("fence", self._elections.fence(fence, deadline))
        for name in chunks:
            txn.add("chunk", check(f"{anchor}/{name}", 0))
        return txn

    @staticmethod
    def _retry(
        role: str | None, error: Exception | None, fence: Leadership | None, chunks: list[str]
    ) -> list[str]:
        """Judge a failure every write shares: raise, or return the chunks still usable for a retry."""
        if role == "fence" and fence is not None:
            raise FencedError(f"the leadership of {fence.leader_id!r} over {fence.service!r} ended")
        if role == "chunk":
            return []  # a concurrent clean-up took them: write them again
        if role == "anchor" and isinstance(error, BadVersionError):
            return chunks  # changed since it was read: read it again
        raise ConsensusError(f"ZooKeeper refused the write: {type(error).__name__}")

    def _anchor_version(self, key: str, expected: int, deadline: float) -> int:
        """The anchor's ``stat.version`` while ``key`` is at version ``expected``.

        ``KeyNotFoundError`` or ``VersionConflictError`` otherwise, after a
        linearizable read confirmed it.
        """
        anchor = self._layout.anchor(key)
        stat = None
        for barrier in (None, self._layout.barrier_path):
            [stat] = self._connection.read(
                lambda client: [client.exists_async(anchor)], deadline, barrier=barrier
            )
            if stat is not None and stat.dataLength > 0 and stat.mzxid == expected:
                return int(stat.version)
        if stat is None or stat.dataLength == 0:
            raise KeyNotFoundError(f"key {key!r} does not exist")
        raise VersionConflictError(f"key {key!r} is at version {stat.mzxid}, not {expected}")

    def _ensure_anchor(self, key: str, deadline: float) -> None:
        anchor = self._layout.anchor(key)
        if anchor not in self._anchors:
            ensure(self._connection, [*self._layout.directories(parent_of(key)), anchor], deadline)
            self._anchors.add(anchor)

    def _write_chunks(
        self, anchor: str, chunks: tuple[bytes, ...], deadline: float, *, key: str | None = None
    ) -> list[str]:
        """Write chunks below ``anchor``; with ``key``, a missing anchor means the key is missing."""
        try:
            return payload.create_chunks(
                self._connection, f"{anchor}/{CHUNK_PREFIX}", chunks, deadline, ephemeral=False
            )
        except ConsensusError:
            if key is None:
                raise
            [stat] = self._connection.read(
                lambda client: [client.exists_async(anchor)], deadline, barrier=None
            )
            if stat is None:
                raise KeyNotFoundError(f"key {key!r} does not exist") from None
            raise

    def _written(self, anchor: str, stat: Any, chunks: list[str], deadline: float) -> int:
        """The new version; removes chunks no longer referenced when the anchor has more."""
        if stat.numChildren > len(chunks):
            self._collect(anchor, deadline)
        return int(stat.mzxid)

    def _collect(self, anchor: str, deadline: float) -> None:
        """Best effort: delete the anchor's chunks its current value does not refer to.

        The transaction checks the anchor's version, so a value published
        meanwhile keeps its chunks; a writer whose unpublished chunks go here
        sees its chunk check fail and writes them again.
        """
        try:
            data, children = self._connection.read(
                lambda client: [client.get_async(anchor), client.get_children_async(anchor)],
                deadline,
                barrier=None,
            )
            if isinstance(data, Exception) or isinstance(children, Exception):
                return
            garbage = set(children) - set(payload.chunk_names(data[0]))
            if garbage:
                txn = Txn()
                txn.add("anchor", check(anchor, data[1].version))
                for name in sorted(garbage):
                    txn.add("chunk", delete(f"{anchor}/{name}"))
                txn.commit(self._connection, deadline)
        except ConsensusError as exc:
            log.debug("clean-up of chunks below %s failed: %s", anchor, exc)

    def _drop_chunks(self, anchor: str, chunks: list[str], deadline: float) -> None:
        """Best effort: delete chunks a failed write wrote (a later write would collect them)."""
        if not chunks:
            return

        def build(client: KazooClient) -> list[Any]:
            return [client.delete_async(f"{anchor}/{name}") for name in chunks]

        try:
            self._connection.run(build, deadline, idempotent=True)
        except ConsensusError as exc:
            log.debug("dropping unused chunks below %s failed: %s", anchor, exc)
