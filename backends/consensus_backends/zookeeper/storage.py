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
* ``fence=`` adds the leader check to the same transaction, and every write
  carries the seal's check (``seal.Seal``): on a sealed root it raises
  ``SealedError`` and is not applied.
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
    SealedError,
    VersionConflictError,
)
from consensus_api.keys import join_key, parent_of
from consensus_api.model import Leadership, Versioned
from consensus_backends.zookeeper import payload, steps
from consensus_backends.zookeeper.election import Elections
from consensus_backends.zookeeper.layout import CHUNK_PREFIX, MARKER, Layout, decode_name
from consensus_backends.zookeeper.lease import Connection
from consensus_backends.zookeeper.seal import Seal
from consensus_backends.zookeeper.steps import Steps, drive
from consensus_backends.zookeeper.txn import (
    KnownPaths,
    Txn,
    check,
    check_deadline,
    create,
    delete,
    ensuring,
    set_data,
)

log = logging.getLogger("consensus_api.zookeeper")


class StorageSteps:
    """The storage operations of one backend as ``steps.Steps``: every request they send and how
    each outcome decides the result, the error or the next request. Each takes the ``deadline`` its
    driver bounds every request by."""

    def __init__(self, layout: Layout, elections: Elections, seal: Seal) -> None:
        self._layout = layout
        self._elections = elections
        self._seal = seal
        self._anchors = KnownPaths()

    def fetch(self, key: str, deadline: float, *, linearizable: bool = True) -> Steps[Versioned | None]:
        """The value and version of ``key``, read linearizably (else in this session's order)."""
        anchor = self._layout.anchor(key)
        barrier = self._layout.barrier_path if linearizable else None
        while True:
            check_deadline(deadline, "fetch")
            [found] = yield from steps.send(lambda client: [client.get_async(anchor)], barrier=barrier)
            if isinstance(found, NoNodeError) or not found[0]:
                return None
            data, stat = found
            value = yield from payload.decoding(anchor, data)
            if value is not None:
                return Versioned(value, int(stat.mzxid))

    def keys(self, namespace: str, *, linearizable: bool = True) -> Steps[frozenset[str]]:
        """The keys one level below ``namespace``, read linearizably (else in this session's order)."""
        directory = self._layout.directory(namespace)
        barrier = self._layout.barrier_path if linearizable else None
        [names] = yield from steps.send(
            lambda client: [client.get_children_async(directory)], barrier=barrier
        )
        if isinstance(names, NoNodeError):
            return frozenset()
        return frozenset(
            join_key(namespace, decode_name(name[len(MARKER) :])) for name in names if name.startswith(MARKER)
        )

    def put(self, key: str, value: bytes, fence: Leadership | None, deadline: float) -> Steps[int]:
        """Create ``key``; ``KeyExistsError`` if it exists."""
        encoded = payload.encode(value)
        marker, anchor = self._layout.key_paths(key)
        chunks: list[str] = []
        try:
            while True:
                check_deadline(deadline, "put")
                if encoded.chunks and not chunks:
                    yield from self._ensure_anchor(key)
                    chunks = yield from self._write_chunks(anchor, encoded.chunks)
                txn = yield from self._start(fence, anchor, chunks, deadline)
                txn.add("marker", create(marker))
                if anchor not in self._anchors:
                    txn.add("new anchor", create(anchor))
                txn.add("anchor", set_data(anchor, payload.publish(chunks) if chunks else encoded.data))
                results, role, error = yield from txn.committing()
                if error is None:
                    self._anchors.add(anchor)
                    return (yield from self._written(anchor, results[-1], chunks))
                if role == "marker" and isinstance(error, NodeExistsError):
                    raise KeyExistsError(f"key {key!r} already exists")
                if role == "marker" and isinstance(error, NoNodeError):
                    yield from ensuring(self._layout.directories(parent_of(key)))
                elif role == "new anchor" and isinstance(error, NodeExistsError):
                    self._anchors.add(anchor)
                elif role == "anchor" and isinstance(error, NoNodeError):
                    self._anchors.discard(anchor)
                else:
                    chunks = self._retry(role, error, fence, chunks)
        except (KeyExistsError, FencedError, SealedError):
            yield from self._drop_chunks(anchor, chunks)
            raise

    def update(
        self, key: str, value: bytes, version: int | None, fence: Leadership | None, deadline: float
    ) -> Steps[int]:
        """Replace the value of ``key`` (at ``version`` when given)."""
        encoded = payload.encode(value)
        marker, anchor = self._layout.key_paths(key)
        chunks: list[str] = []
        try:
            while True:
                check_deadline(deadline, "update")
                if encoded.chunks and not chunks:
                    chunks = yield from self._write_chunks(anchor, encoded.chunks, key=key)
                txn = yield from self._start(fence, anchor, chunks, deadline)
                data = payload.publish(chunks) if chunks else encoded.data
                if version is None:
                    txn.add("marker", check(marker, -1))
                    txn.add("anchor", set_data(anchor, data))
                else:
                    expected = yield from self._anchor_version(key, version)
                    txn.add("anchor", set_data(anchor, data, expected))
                results, role, error = yield from txn.committing()
                if error is None:
                    return (yield from self._written(anchor, results[-1], chunks))
                if isinstance(error, NoNodeError) and role in ("marker", "anchor"):
                    raise KeyNotFoundError(f"key {key!r} does not exist")
                chunks = self._retry(role, error, fence, chunks)
        except (KeyNotFoundError, VersionConflictError, FencedError, SealedError):
            yield from self._drop_chunks(anchor, chunks)
            raise

    def delete(self, key: str, version: int | None, fence: Leadership | None, deadline: float) -> Steps[None]:
        """Remove ``key`` (at ``version`` when given); its anchor stays, emptied."""
        marker, anchor = self._layout.key_paths(key)
        while True:
            check_deadline(deadline, "delete")
            txn = yield from self._start(fence, anchor, [], deadline)
            expected = -1 if version is None else (yield from self._anchor_version(key, version))
            txn.add("marker", delete(marker))
            txn.add("anchor", set_data(anchor, b"", expected))
            results, role, error = yield from txn.committing()
            if error is None:
                yield from self._written(anchor, results[-1], [])
                return
            if isinstance(error, NoNodeError) and role in ("marker", "anchor"):
                raise KeyNotFoundError(f"key {key!r} does not exist")
            self._retry(role, error, fence, [])

    # Helpers

    def _start(self, fence: Leadership | None, anchor: str, chunks: list[str], deadline: float) -> Steps[Txn]:
        """A transaction holding the seal check (first: a sealed root refuses every write), the fence
        check and the checks that ``chunks`` still exist."""
        txn = Txn()
        txn.add("seal", (yield from self._seal.guarding(deadline)))
        if fence is not None:
            txn.add("fence", (yield from self._elections.fence(fence, deadline)))
        for name in chunks:
            txn.add("chunk", check(f"{anchor}/{name}", 0))
        return txn

    def _retry(
        self, role: str | None, error: Exception | None, fence: Leadership | None, chunks: list[str]
    ) -> list[str]:
        """Judge a failure every write shares: raise, or return the chunks still usable for a retry."""
        if role == "seal":
            self._seal.refused()  # sealed or unsealed since: the retry reads it again
            return chunks
        if role == "fence" and fence is not None:
            raise FencedError(f"the leadership of {fence.leader_id!r} over {fence.service!r} ended")
        if role == "chunk":
            return []  # a concurrent clean-up took them: write them again
        if role == "anchor" and isinstance(error, BadVersionError):
            return chunks  # changed since it was read: read it again
        raise ConsensusError(f"ZooKeeper refused the write: {type(error).__name__}")

    def _anchor_version(self, key: str, expected: int) -> Steps[int]:
        """The anchor's ``stat.version`` while ``key`` is at version ``expected``.

        ``KeyNotFoundError`` or ``VersionConflictError`` otherwise, after a
        linearizable read confirmed it.
        """
        anchor = self._layout.anchor(key)
        stat = None
        for barrier in (None, self._layout.barrier_path):
            [stat] = yield from steps.send(lambda client: [client.exists_async(anchor)], barrier=barrier)
            if stat is not None and stat.dataLength > 0 and stat.mzxid == expected:
                return int(stat.version)
        if stat is None or stat.dataLength == 0:
            raise KeyNotFoundError(f"key {key!r} does not exist")
        raise VersionConflictError(f"key {key!r} is at version {stat.mzxid}, not {expected}")

    def _ensure_anchor(self, key: str) -> Steps[None]:
        anchor = self._layout.anchor(key)
        if anchor not in self._anchors:
            yield from ensuring([*self._layout.directories(parent_of(key)), anchor])
            self._anchors.add(anchor)

    def _write_chunks(
        self, anchor: str, chunks: tuple[bytes, ...], *, key: str | None = None
    ) -> Steps[list[str]]:
        """Write chunks below ``anchor``; with ``key``, a missing anchor means the key is missing."""
        try:
            return (yield from payload.creating_chunks(f"{anchor}/{CHUNK_PREFIX}", chunks, ephemeral=False))
        except ConsensusError:
            if key is None:
                raise
            [stat] = yield from steps.send(lambda client: [client.exists_async(anchor)])
            if stat is None:
                raise KeyNotFoundError(f"key {key!r} does not exist") from None
            raise

    def _written(self, anchor: str, stat: Any, chunks: list[str]) -> Steps[int]:
        """The new version; removes chunks no longer referenced when the anchor has more."""
        if stat.numChildren > len(chunks):
            yield from self._collect(anchor)
        return int(stat.mzxid)

    def _collect(self, anchor: str) -> Steps[None]:
        """Best effort: delete the anchor's chunks its current value does not refer to.

        The transaction checks the anchor's version, so a value published
        meanwhile keeps its chunks; a writer whose unpublished chunks go here
        sees its chunk check fail and writes them again.
        """
        try:
            data, children = yield from steps.send(
                lambda client: [client.get_async(anchor), client.get_children_async(anchor)]
            )
            if isinstance(data, Exception) or isinstance(children, Exception):
                return
            garbage = set(children) - set(payload.chunk_names(data[0]))
            if garbage:
                txn = Txn()
                txn.add("anchor", check(anchor, data[1].version))
                for name in sorted(garbage):
                    txn.add("chunk", delete(f"{anchor}/{name}"))
                yield from txn.committing()
        except ConsensusError as exc:
            log.debug("clean-up of chunks below %s failed: %s", anchor, exc)

    def _drop_chunks(self, anchor: str, chunks: list[str]) -> Steps[None]:
        """Best effort: delete chunks a failed write wrote (a later write would collect them)."""
        if not chunks:
            return

        def build(client: KazooClient) -> list[Any]:
            return [client.delete_async(f"{anchor}/{name}") for name in chunks]

        try:
            yield from steps.send(build)
        except ConsensusError as exc:
            log.debug("dropping unused chunks below %s failed: %s", anchor, exc)


class Storage:
    """The storage operations of one backend (``StorageSteps``) over blocking requests, each
    operation bounded by the request timeout."""

    def __init__(
        self, connection: Connection, layout: Layout, elections: Elections, seal: Seal, timeout: float
    ) -> None:
        self._connection = connection
        self._timeout = timeout
        self.steps = StorageSteps(layout, elections, seal)

    def fetch(self, key: str, *, linearizable: bool = True) -> Versioned | None:
        """The value and version of ``key``, read linearizably (else in this session's order)."""
        deadline = self._deadline()
        return drive(self._connection, self.steps.fetch(key, deadline, linearizable=linearizable), deadline)

    def keys(self, namespace: str, *, linearizable: bool = True) -> frozenset[str]:
        """The keys one level below ``namespace``, read linearizably (else in this session's order)."""
        return drive(
            self._connection, self.steps.keys(namespace, linearizable=linearizable), self._deadline()
        )

    def put(self, key: str, value: bytes, fence: Leadership | None) -> int:
        """Create ``key``; ``KeyExistsError`` if it exists."""
        deadline = self._deadline()
        return drive(self._connection, self.steps.put(key, value, fence, deadline), deadline)

    def update(self, key: str, value: bytes, version: int | None, fence: Leadership | None) -> int:
        """Replace the value of ``key`` (at ``version`` when given)."""
        deadline = self._deadline()
        return drive(self._connection, self.steps.update(key, value, version, fence, deadline), deadline)

    def delete(self, key: str, version: int | None, fence: Leadership | None) -> None:
        """Remove ``key`` (at ``version`` when given); its anchor stays, emptied."""
        deadline = self._deadline()
        drive(self._connection, self.steps.delete(key, version, fence, deadline), deadline)

    def _deadline(self) -> float:
        return time.monotonic() + self._timeout
