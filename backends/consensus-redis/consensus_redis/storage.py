"""Key-value storage: a hash per key, one Lua script per write (``scripts``), atomic on the server.

Guarantees: every write's conditions (existence, version, and for a fenced
write the election's term and leader, and before them the seal: ``seal``) are
checked in the same script that writes; versions come from one counter (``INCR``), so they strictly increase
across updates, deletes and re-creates; reads go to the one server, so they
are linearizable. ``walk`` reads pages of ``WALK_PAGE`` keys in key order, each
by one script.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from consensus_api.errors import (
    FencedError,
    KeyExistsError,
    KeyNotFoundError,
    SealedError,
    VersionConflictError,
)
from consensus_api.keys import SEPARATOR
from consensus_api.model import Leadership, Versioned
from consensus_redis import scripts
from consensus_redis.client import RedisClient, Script
from consensus_redis.layout import Layout

#: Keys (with values) per page of ``walk``.
WALK_PAGE = 256

PUT, UPDATE, DELETE = Script(scripts.PUT), Script(scripts.UPDATE), Script(scripts.DELETE)
WALK = Script(scripts.WALK_PAGE)


class Storage:
    """The keys and values under one prefix; each call is bounded by ``request_timeout``."""

    def __init__(self, client: RedisClient, layout: Layout) -> None:
        self._client = client
        self._layout = layout

    def fetch(self, key: str) -> Versioned | None:
        """The value and version of ``key`` (``HMGET`` on the one server: linearizable)."""
        return versioned(self._client.command("HMGET", self._layout.key("kv", key), "v", "n"))

    def put(self, key: str, value: bytes, fence: Leadership | None) -> int:
        return created(self._write(PUT, fence, key, value), key)

    def update(self, key: str, value: bytes, version: int | None, fence: Leadership | None) -> int:
        reply = conditioned(
            self._write(UPDATE, fence, key, value, "" if version is None else version), key, version
        )
        return int(reply[1])

    def delete(self, key: str, version: int | None, fence: Leadership | None) -> None:
        conditioned(self._write(DELETE, fence, key, "" if version is None else version), key, version)

    def keys(self, namespace: str) -> frozenset[str]:
        """The set of existing keys directly below ``namespace`` (kept by the write scripts)."""
        return key_set(self._client.command("SMEMBERS", self._layout.key("ns", namespace)))

    def walk(self, namespace: str) -> Iterator[tuple[str, Versioned]]:
        """Pages of ``WALK_PAGE`` keys in key order, each read by one script (a linearizable read)."""
        prefix = namespace + SEPARATOR if namespace else ""
        after = ""
        while True:
            reply = self._client.run(WALK, self._layout.prefix, prefix, after, WALK_PAGE, write=False)
            rows = reply[2]
            for i in range(0, len(rows), 3):
                yield rows[i].decode(), Versioned(bytes(rows[i + 1]), int(rows[i + 2]))
            if int(reply[1]) < WALK_PAGE or not rows:
                return
            after = rows[-3].decode()

    def _write(self, script: Script, fence: Leadership | None, *args: Any) -> list[Any]:
        """Run a storage script (``written``)."""
        return written(self._client.run(script, self._layout.prefix, *fencing(fence), *args), fence)


# What the scripts are sent and what their replies mean: also for the asyncio storage
# (``consensus_redis.aio``), which sends the same scripts.


def fencing(fence: Leadership | None) -> tuple[str, str, str | int]:
    """A storage script's fence arguments (empty: unfenced); ``FencedError`` for a term never current."""
    if fence is None:
        return "", "", ""
    if fence.term < 1:
        raise FencedError(f"term {fence.term} of {fence.service!r} was never current")
    return fence.service, fence.leader_id, fence.term


def written(reply: list[Any], fence: Leadership | None) -> list[Any]:
    """A storage script's reply; ``SealedError`` if the store is sealed, ``FencedError`` if ``fence``
    is not the current leadership."""
    if reply[0] == "sealed":
        raise SealedError("the store is sealed by a migration's cut-over; the write was not applied")
    if reply[0] == "fenced" and fence is not None:
        raise FencedError(f"{fence.leader_id!r} no longer leads {fence.service!r} in term {fence.term}")
    return reply


def created(reply: list[Any], key: str) -> int:
    """``PUT``'s new version; ``KeyExistsError``."""
    if reply[0] == "exists":
        raise KeyExistsError(f"key {key!r} already exists")
    return int(reply[1])


def conditioned(reply: list[Any], key: str, version: int | None) -> list[Any]:
    """``UPDATE``'s or ``DELETE``'s reply; ``KeyNotFoundError``, ``VersionConflictError``."""
    if reply[0] == "missing":
        raise KeyNotFoundError(f"key {key!r} does not exist")
    if reply[0] == "conflict":
        raise VersionConflictError(f"key {key!r} is at version {int(reply[1])}, not {version}")
    return reply


def versioned(fields: list[Any]) -> Versioned | None:
    """``HMGET key v n`` as what ``fetch`` returns."""
    value, version = fields
    return None if version is None else Versioned(bytes(value), int(version))


def key_set(members: Any) -> frozenset[str]:
    """``SMEMBERS`` of a namespace's set as what ``keys`` returns."""
    return frozenset(member.decode() for member in members)
