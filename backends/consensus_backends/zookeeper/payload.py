"""Values and member data as znode data, split into chunk znodes when too large for one.

ZooKeeper refuses a request larger than ``jute.maxbuffer`` (1 MB less a few
bytes by default), so a 1 MiB value cannot live in one znode. A payload is
``0x00 + bytes`` when it fits (``INLINE_LIMIT``), else ``0x01`` followed by
the names of chunk znodes (separated by ``/``, which no name contains). Chunks
are written first and never changed; the write that publishes them checks
in the same transaction that they all still exist. A reader that finds a
chunk gone (the value changed meanwhile) reads again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from consensus_api.errors import ConsensusError
from consensus_backends.zookeeper import steps
from consensus_backends.zookeeper.lease import Connection
from consensus_backends.zookeeper.steps import Steps

INLINE_LIMIT = 1_000_000
CHUNK_SIZE = 1_000_000
INLINE, CHUNKED = 0, 1


@dataclass(frozen=True, slots=True)
class Encoded:
    """A payload ready to store: ``data`` for the znode, ``chunks`` to write before it."""

    data: bytes
    chunks: tuple[bytes, ...] = ()


def encode(value: bytes) -> Encoded:
    """``value`` inline when it fits, else as chunks (their names are filled in by ``publish``)."""
    if len(value) <= INLINE_LIMIT:
        return Encoded(bytes([INLINE]) + value)
    starts = range(0, len(value), CHUNK_SIZE)
    return Encoded(b"", tuple(value[start : start + CHUNK_SIZE] for start in starts))


def publish(names: Sequence[str]) -> bytes:
    """The znode data that refers to the chunks ``names``."""
    return bytes([CHUNKED]) + "/".join(names).encode("utf-8")


def chunk_names(data: bytes) -> list[str]:
    """The chunk names ``data`` refers to (none for an inline payload)."""
    if data[:1] != bytes([CHUNKED]):
        return []
    return data[1:].decode("utf-8").split("/")


def create_chunks(
    connection: Connection, prefix: str, chunks: Sequence[bytes], deadline: float, *, ephemeral: bool
) -> list[str]:
    """Write ``chunks`` as sequential znodes ``<prefix><seq>``; returns their names in order."""
    return steps.drive(connection, creating_chunks(prefix, chunks, ephemeral=ephemeral), deadline)


def creating_chunks(prefix: str, chunks: Sequence[bytes], *, ephemeral: bool) -> Steps[list[str]]:
    """``create_chunks`` as steps."""

    def build(client: KazooClient) -> list[Any]:
        return [client.create_async(prefix, chunk, ephemeral=ephemeral, sequence=True) for chunk in chunks]

    outcomes = yield from steps.send(build, idempotent=False)
    for outcome in outcomes:
        if isinstance(outcome, Exception):
            raise ConsensusError(f"could not store a large value in ZooKeeper ({type(outcome).__name__})")
    return [str(path).rpartition("/")[2] for path in outcomes]


def decode(connection: Connection, parent: str, data: bytes, deadline: float) -> bytes | None:
    """The payload's bytes, reading chunks below ``parent``; None if a chunk vanished (read again)."""
    return steps.drive(connection, decoding(parent, data), deadline)


def decoding(parent: str, data: bytes) -> Steps[bytes | None]:
    """``decode`` as steps (none for an inline payload)."""
    if data[:1] == bytes([INLINE]) or not data:
        return data[1:]
    if data[:1] != bytes([CHUNKED]):
        raise ConsensusError(f"the znode data below {parent} was not written by consensus-api")
    names = chunk_names(data)

    def build(client: KazooClient) -> list[Any]:
        return [client.get_async(f"{parent}/{name}") for name in names]

    parts = yield from steps.send(build)
    if any(isinstance(part, NoNodeError) for part in parts):
        return None
    return b"".join(bytes(part[0]) for part in parts)
