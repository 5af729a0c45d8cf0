"""ZooKeeper multi-operations with a role per operation, to tell which one failed."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError, RolledBackError
from kazoo.exceptions import RuntimeInconsistency as Inconsistent

from consensus_api.errors import ConsensusError, OperationTimeoutError
from consensus_backends.zookeeper import steps
from consensus_backends.zookeeper.lease import Connection
from consensus_backends.zookeeper.steps import Steps

Op = Callable[[Any], None]


def check(path: str, version: int) -> Op:
    """Fail the transaction unless ``path`` exists (at ``version`` unless -1)."""
    return lambda t: t.check(path, version)


def create(path: str, data: bytes = b"", *, ephemeral: bool = False, sequence: bool = False) -> Op:
    """Create ``path``; fails on ``NodeExistsError`` or a missing parent (``NoNodeError``)."""
    return lambda t: t.create(path, data, ephemeral=ephemeral, sequence=sequence)


def set_data(path: str, data: bytes, version: int = -1) -> Op:
    """Replace the data of ``path`` (at ``version`` unless -1); its result is the new stat."""
    return lambda t: t.set_data(path, data, version)


def delete(path: str, version: int = -1) -> Op:
    """Delete ``path`` (at ``version`` unless -1)."""
    return lambda t: t.delete(path, version)


class Txn:
    """Operations committed atomically, each tagged with a role."""

    def __init__(self) -> None:
        self._ops: list[Op] = []
        self._roles: list[str] = []

    def add(self, role: str, op: Op) -> None:
        """Append ``op``, tagged ``role``."""
        self._ops.append(op)
        self._roles.append(role)

    def commit(
        self, connection: Connection, deadline: float
    ) -> tuple[list[Any], str | None, Exception | None]:
        """Commit; returns the per-operation results and the role and error of the failed operation."""
        return steps.drive(connection, self.committing(), deadline)

    def committing(self) -> Steps[tuple[list[Any], str | None, Exception | None]]:
        """``commit`` as steps."""

        def build(client: KazooClient) -> list[Any]:
            transaction = client.transaction()
            for op in self._ops:
                op(transaction)
            return [transaction.commit_async()]

        [results] = yield from steps.send(build, idempotent=False)
        if isinstance(results, Exception):
            raise ConsensusError(f"ZooKeeper refused a transaction: {type(results).__name__}")
        for role, result in zip(self._roles, results, strict=True):
            if isinstance(result, Exception) and not isinstance(result, RolledBackError | Inconsistent):
                return results, role, result
        return results, None, None


def ensure(connection: Connection, paths: Iterable[str], deadline: float) -> None:
    """Create the persistent, empty znodes ``paths`` (parents first) where they are missing."""
    steps.drive(connection, ensuring(paths), deadline)


def ensuring(paths: Iterable[str]) -> Steps[None]:
    """``ensure`` as steps."""
    wanted = list(paths)

    def build(client: KazooClient) -> list[Any]:
        return [client.create_async(path, b"") for path in wanted]

    for outcome in (yield from steps.send(build)):
        if isinstance(outcome, Exception) and not isinstance(outcome, NodeExistsError):
            raise ConsensusError(f"could not create a ZooKeeper znode ({type(outcome).__name__})")


def check_deadline(deadline: float, what: str) -> None:
    """Raise ``OperationTimeoutError`` once ``deadline`` has passed."""
    if time.monotonic() >= deadline:
        raise OperationTimeoutError(f"{what} did not complete within the request timeout")


class KnownPaths:
    """A bounded set of permanent znodes known to exist (they are never deleted)."""

    def __init__(self, limit: int = 10_000) -> None:
        self._paths: OrderedDict[str, None] = OrderedDict()
        self._limit = limit
        self._lock = threading.Lock()

    def __contains__(self, path: str) -> bool:
        with self._lock:
            return path in self._paths

    def add(self, path: str) -> None:
        """Remember ``path``, forgetting the oldest entry beyond the limit."""
        with self._lock:
            self._paths[path] = None
            self._paths.move_to_end(path)
            while len(self._paths) > self._limit:
                self._paths.popitem(last=False)

    def discard(self, path: str) -> None:
        """Forget ``path`` (someone deleted it after all)."""
        with self._lock:
            self._paths.pop(path, None)
