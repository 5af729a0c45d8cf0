"""``walk``: every key below a namespace, by a breadth-first walk of the directory znodes.

Guarantees: the first request of the walk goes behind a no-op quorum write
(the barrier of ``Connection.read``), and ZooKeeper answers one session's
requests in order, so every read sees at least every write completed before
the walk started, and nothing newer than the moment it is answered. A key is
listed by its marker and read from its anchor: a key deleted in between is
skipped (its anchor is emptied), so every pair yielded was the key's state at
its read. Each directory and each key is visited once: no key is yielded
twice. Requests go in pipelined pages of ``PAGE`` znodes, each bounded by
``request_timeout``.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from consensus_api.errors import ConsensusError
from consensus_api.keys import join_key
from consensus_api.model import Versioned
from consensus_backends.zookeeper import payload
from consensus_backends.zookeeper.layout import DIRECTORY, MARKER, Layout, decode_name
from consensus_backends.zookeeper.lease import Connection
from consensus_backends.zookeeper.txn import check_deadline

#: Znodes per pipelined page of requests.
PAGE = 256


def walk(
    connection: Connection, layout: Layout, namespace: str, timeout: float
) -> Iterator[tuple[str, Versioned]]:
    """Every live key below ``namespace`` with its value and version (``mzxid`` of its anchor)."""
    directories: deque[tuple[str, str]] = deque([(namespace, layout.directory(namespace))])
    barrier: str | None = layout.barrier_path
    while directories:
        batch = [directories.popleft() for _ in range(min(PAGE, len(directories)))]
        paths = [path for _, path in batch]
        listings = connection.read(
            _requests("get_children_async", paths), time.monotonic() + timeout, barrier=barrier
        )
        barrier = None
        keys: list[str] = []
        for (name_space, path), names in zip(batch, listings, strict=True):
            if isinstance(names, NoNodeError):
                continue
            _raise_failure(names, path)
            for name in sorted(names):
                if name.startswith(MARKER):
                    keys.append(join_key(name_space, decode_name(name[len(MARKER) :])))
                elif name.startswith(DIRECTORY):
                    below = join_key(name_space, decode_name(name[len(DIRECTORY) :]))
                    directories.append((below, f"{path}/{name}"))
        for start in range(0, len(keys), PAGE):
            yield from _values(connection, layout, keys[start : start + PAGE], timeout)


def _values(
    connection: Connection, layout: Layout, keys: list[str], timeout: float
) -> Iterator[tuple[str, Versioned]]:
    """The current values of ``keys`` (skipping the ones deleted since they were listed)."""
    deadline = time.monotonic() + timeout
    anchors = [layout.anchor(key) for key in keys]
    found = connection.read(_requests("get_async", anchors), deadline, barrier=None)
    for key, anchor, first in zip(keys, anchors, found, strict=True):
        result = first
        while True:
            if isinstance(result, NoNodeError) or not result[0]:
                break  # deleted since it was listed
            _raise_failure(result, anchor)
            data, stat = result
            value = payload.decode(connection, anchor, data, deadline)
            if value is not None:
                yield key, Versioned(value, int(stat.mzxid))
                break
            check_deadline(deadline, "walk")  # a chunk vanished: the value changed; read it again
            [result] = connection.read(_requests("get_async", [anchor]), deadline, barrier=None)


def _requests(method: str, paths: list[str]) -> Callable[[KazooClient], list[Any]]:
    """A batch that calls ``client.<method>(path)`` for each of ``paths``, pipelined."""

    def build(client: KazooClient) -> list[Any]:
        call = getattr(client, method)
        return [call(path) for path in paths]

    return build


def _raise_failure(result: Any, path: str) -> None:
    if isinstance(result, Exception):
        raise ConsensusError(f"ZooKeeper refused to read {path}: {type(result).__name__}")
