"""The ZooKeeper backend's storage over kazoo's asynchronous requests, completed on the event loop.

The same operations as the blocking storage (``storage.StorageSteps``: the same
znodes, transactions, chunks, seal and fence checks, and errors), each batch
sent with kazoo's ``*_async`` calls on the backend's own session and awaited:
the completion callback (on kazoo's completion thread) hands the answer to the
loop with ``call_soon_threadsafe``. The rules of a batch (session checks,
retries, error translation) are ``client.Pipeline``'s own.

Guarantees:

* Every call ends within ``request_timeout``; only ``ConsensusError`` escapes
  (and ``asyncio.CancelledError`` for a call its caller cancelled: effect unknown).
* No thread and no cap on calls in flight: kazoo pipelines them on the session.
* No call spans two sessions, as with the blocking calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from kazoo.client import KazooClient

from consensus_api.errors import ConsensusError, SessionLostError
from consensus_api.model import Leadership, Versioned
from consensus_backends.zookeeper.client import (
    TRANSIENT_PAUSE,
    Build,
    Pipeline,
    TransientError,
    behind_barrier,
)
from consensus_backends.zookeeper.lease import Connection
from consensus_backends.zookeeper.steps import Requests, Steps
from consensus_backends.zookeeper.storage import StorageSteps

T = TypeVar("T")

#: Seconds between looks at the session while a call waits for a connection.
CONNECTION_POLL = 0.02


@dataclass(eq=False, slots=True)
class _Reader:
    """One read waiting in a ``_Shared`` batch."""

    build: Build
    losses: int
    answer: asyncio.Future[list[Any]]
    start: int = 0
    end: int = 0


@dataclass(eq=False, slots=True)
class _Shared:
    """Linearizable reads sent behind one barrier: those that asked within one turn of the loop."""

    barrier: str
    deadline: float
    readers: list[_Reader] = field(default_factory=list)

    def build(self, client: KazooClient) -> list[Any]:
        sent = list(behind_barrier(lambda _: [], self.barrier)(client))
        for reader in self.readers:
            reader.start = len(sent)
            sent.extend(reader.build(client))
            reader.end = len(sent)
        return sent


class AsyncPipeline:
    """``client.Pipeline``'s batches, awaited on the event loop it was made on.

    Linearizable reads share their barrier: the reads that ask for one within one turn of the loop
    go behind a single no-op quorum write, sent after every one of them began, so each still sees
    every write completed before it began (``Pipeline.read``); a read that began in an earlier
    session than the one the batch went out in raises ``SessionLostError``.
    """

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self._pipeline = connection.requests
        self._loop = asyncio.get_running_loop()
        self._joining: _Shared | None = None
        self._sending: set[asyncio.Task[None]] = set()

    async def send(self, requests: Requests, deadline: float) -> list[Any]:
        """The outcomes of one batch (``Pipeline.run``, or ``Pipeline.read`` with a barrier)."""
        if requests.barrier is not None:
            return await self._behind_shared_barrier(requests.build, requests.barrier, deadline)
        return await self._send(requests.build, deadline, idempotent=requests.idempotent)

    async def _behind_shared_barrier(self, build: Build, barrier: str, deadline: float) -> list[Any]:
        shared = self._joining
        if shared is None or shared.barrier != barrier:
            shared = self._joining = _Shared(barrier, deadline)
            task = self._loop.create_task(self._send_shared(shared))
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)
        reader = _Reader(build, self._connection.losses, self._loop.create_future())
        shared.readers.append(reader)
        return await reader.answer

    async def _send_shared(self, shared: _Shared) -> None:
        """Send ``shared`` once the loop took a turn (every read of this one has joined)."""
        await asyncio.sleep(0)
        if self._joining is shared:
            self._joining = None
        losses = self._connection.losses
        try:
            outcomes = await self._send(shared.build, shared.deadline, idempotent=True)
        except ConsensusError as exc:
            for reader in shared.readers:
                if not reader.answer.done():
                    reader.answer.set_exception(exc)
            return
        except BaseException:
            for reader in shared.readers:
                reader.answer.cancel()
            raise
        for reader in shared.readers:
            if reader.answer.done():  # cancelled by its caller
                continue
            if reader.losses != losses:
                reader.answer.set_exception(
                    SessionLostError("the ZooKeeper session was lost during the call")
                )
            else:
                reader.answer.set_result(outcomes[reader.start : reader.end])

    async def _send(self, build: Build, deadline: float, *, idempotent: bool) -> list[Any]:
        losses = self._connection.losses
        while True:
            connected = self._connection.connected or await self._wait_connected(losses, deadline)
            self._pipeline.admit(losses, connected)
            try:
                results = build(self._pipeline.client)
                await self._settled(results, deadline)
                return self._pipeline.outcomes(results, deadline, losses, idempotent=idempotent)
            except TransientError as exc:
                Pipeline.judge_transient(exc, idempotent=idempotent)
                await asyncio.sleep(TRANSIENT_PAUSE)
            except ConsensusError:
                raise
            except Exception as exc:  # anything else kazoo raised: never let it escape
                raise ConsensusError(f"ZooKeeper request failed: {type(exc).__name__}: {exc}") from None

    async def _wait_connected(self, losses: int, deadline: float) -> bool:
        """``Connection.wait_connected`` without blocking the loop (it looks every ``CONNECTION_POLL``
        seconds, only while a call waits for a connection)."""
        connection = self._connection
        while not connection.connected and connection.losses == losses and not connection.closing:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            await asyncio.sleep(min(CONNECTION_POLL, remaining))
        return connection.connected

    async def _settled(self, results: Sequence[Any], deadline: float) -> None:
        """Wait until every result is set or ``deadline`` passed: the last first (kazoo sets them in
        the order they were sent, so the others are set by then)."""
        for result in reversed(results):
            if not result.ready():
                await self._ready(result, deadline)

    async def _ready(self, result: Any, deadline: float) -> None:
        future: asyncio.Future[None] = self._loop.create_future()

        def wake(_: Any) -> None:  # on kazoo's completion thread
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
                self._loop.call_soon_threadsafe(_resolve, future)

        result.rawlink(wake)
        timer = self._loop.call_later(max(0.0, deadline - time.monotonic()), _resolve, future)
        try:
            await future
        finally:
            timer.cancel()
            result.unlink(wake)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class AsyncStorage:
    """``consensus_api.backend.AsyncStorage`` for ZooKeeper; made and used on one event loop."""

    def __init__(self, connection: Connection, steps: StorageSteps, request_timeout: float) -> None:
        self._pipeline = AsyncPipeline(connection)
        self._steps = steps
        self._timeout = request_timeout

    async def fetch(self, key: str) -> Versioned | None:
        """See ``StorageSteps.fetch``."""
        deadline = self._deadline()
        return await self._drive(self._steps.fetch(key, deadline), deadline)

    async def put(self, key: str, value: bytes, fence: Leadership | None) -> int:
        """See ``StorageSteps.put``."""
        deadline = self._deadline()
        return await self._drive(self._steps.put(key, value, fence, deadline), deadline)

    async def update(self, key: str, value: bytes, version: int | None, fence: Leadership | None) -> int:
        """See ``StorageSteps.update``."""
        deadline = self._deadline()
        return await self._drive(self._steps.update(key, value, version, fence, deadline), deadline)

    async def delete(self, key: str, version: int | None, fence: Leadership | None) -> None:
        """See ``StorageSteps.delete``."""
        deadline = self._deadline()
        await self._drive(self._steps.delete(key, version, fence, deadline), deadline)

    async def keys(self, namespace: str) -> frozenset[str]:
        """See ``StorageSteps.keys``."""
        return await self._drive(self._steps.keys(namespace), self._deadline())

    async def aclose(self) -> None:
        """Nothing to release: the face sends on the backend's own session, which the backend closes."""

    def _deadline(self) -> float:
        return time.monotonic() + self._timeout

    async def _drive(self, steps: Steps[T], deadline: float) -> T:
        """Run ``steps`` with awaited batches, each bounded by ``deadline``."""
        try:
            requests = next(steps)
            while True:
                try:
                    outcomes = await self._pipeline.send(requests, deadline)
                except ConsensusError as exc:
                    requests = steps.throw(exc)
                else:
                    requests = steps.send(outcomes)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
