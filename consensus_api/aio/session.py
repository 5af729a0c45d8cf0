"""The asyncio session: the synchronous core's contract as awaitables and async iterators (the
twins of ``Session``, ``Storage`` and ``ListenerRegistry``)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable, Coroutine, Generator, Iterable
from dataclasses import dataclass
from functools import partial
from types import TracebackType
from typing import Any, Self, TypeVar

from consensus_api import session as sync
from consensus_api.aio._bridge import Bridge, EventStream, cancelled_in_flight, check_workers
from consensus_api.aio._twin import SessionLoop, SessionTwin, awaited
from consensus_api.aio.coordination import (
    AsyncCoordinator,
    AsyncCoordinatorHandler,
    AsyncElection,
    AsyncGroup,
    AsyncIncrementalCoordinator,
    AsyncResourceListener,
    on_loop_handler,
    on_loop_listener,
)
from consensus_api.aio.lock import AsyncLock
from consensus_api.assignors import Assignor
from consensus_api.config import BackendURL, Options
from consensus_api.coordinator.core import HANDLER_METHODS
from consensus_api.coordinator.handler import check_resource_listener, require_callbacks
from consensus_api.coordinator.member import DEFAULT_REBALANCE_TIMEOUT
from consensus_api.errors import ConfigurationError
from consensus_api.keys import check_key, check_namespace
from consensus_api.listeners import ListenerRegistry
from consensus_api.lock import Lease
from consensus_api.model import KeySetChanged, Leadership, SessionState, ValueChanged, Versioned
from consensus_api.storage import NativeStorage, Storage, native_storage

T = TypeVar("T")


@dataclass(frozen=True)
class Inline:
    """Which storage calls of a session run on the loop where the backend answers them without
    waiting: ``connect``'s ``inline_reads`` / ``inline_writes``, where the backend can."""

    reads: bool
    writes: bool


#: Threads of a session's pool for blocking calls, unless ``connect(workers=...)`` says otherwise.
DEFAULT_WORKERS = 8
WALK_BATCH = 256


def connect(
    url: str | None = None,
    *,
    workers: int = DEFAULT_WORKERS,
    inline_reads: bool = True,
    inline_writes: bool = True,
    **options: Any,
) -> Connecting:
    """Open a session like ``consensus_api.connect`` (same URL resolution and options) without
    blocking the running loop; ``workers`` bounds the threads its blocking calls run on.

    ``inline_reads`` (on by default) runs ``storage.fetch`` and ``storage.keys`` on the loop itself
    where the backend answers them without taking a lock another caller may hold (SQLite in WAL
    mode: ``Storage.can_read_nowait``), saving the hop to a worker thread; elsewhere, or where such
    a read would wait, they run on a worker like every other call. The one wait left: a SQLite read
    retries for up to about 10 s while another process is frozen (SIGSTOP) inside the microseconds
    SQLite holds a WAL read-mark lock exclusively, and that would hold the loop;
    ``inline_reads=False`` rules it out at the cost of the hop. ``inline_writes`` (on by default)
    does the same for ``put``, ``update`` and ``delete`` where the backend writes without waiting
    (``Storage.can_write_nowait``; SQLite when the write lock is free at once, else a worker waits
    for it), with the same one wait.

    Use as ``async with aio.connect(url) as session:`` or ``session = await aio.connect(url)``.
    """
    check_workers(workers)
    for name, flag in (("inline_reads", inline_reads), ("inline_writes", inline_writes)):
        if not isinstance(flag, bool):
            raise ConfigurationError(f"{name} must be a bool, not {flag!r}")
    return Connecting(partial(sync.connect, url, **options), workers, inline_reads, inline_writes)


class Connecting:
    """What ``aio.connect`` returns: awaitable (the open session), or an async context manager
    that closes the session on exit."""

    def __init__(
        self, open_session: Callable[[], sync.Session], workers: int, inline_reads: bool, inline_writes: bool
    ) -> None:
        self._open_session = open_session
        self._workers = workers
        self._inline = inline_reads, inline_writes
        self._opened: AsyncSession | None = None

    async def _open(self) -> AsyncSession:
        bridge = Bridge(asyncio.get_running_loop(), self._workers)
        try:
            opened = await bridge.run(self._open_session)
        except BaseException:
            bridge.shutdown()
            raise
        inline_reads, inline_writes = self._inline
        inline = Inline(
            inline_reads and opened.storage.can_read_nowait, inline_writes and opened.storage.can_write_nowait
        )
        loop = SessionLoop(bridge, lambda: opened.state is SessionState.CLOSED)
        return AsyncSession(opened, loop, inline, native_storage(opened.storage))

    def __await__(self) -> Generator[Any, None, AsyncSession]:
        return self._open().__await__()

    async def __aenter__(self) -> AsyncSession:
        self._opened = await self._open()
        return self._opened

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._opened is not None:
            await self._opened.close()


class AsyncSession(SessionTwin[sync.Session]):
    """A :class:`consensus_api.Session` for asyncio code: every call that may block is awaited
    (it runs on the session's thread pool), events are async iterators. Same guarantees as the
    synchronous session; ``async with`` closes it on exit."""

    def __init__(
        self, session: sync.Session, loop: SessionLoop, inline: Inline, native: NativeStorage | None
    ) -> None:
        super().__init__(session, loop)
        self._native = native
        self.storage = AsyncStorage(session.storage, loop, inline, native)
        self.listeners = AsyncListeners(session.listeners, loop)

    @property
    def url(self) -> BackendURL:
        """The session's URL (``redacted()`` for display)."""
        return self._sync.url

    @property
    def settings(self) -> Options:
        """The session's options."""
        return self._sync.settings

    @property
    def backend(self) -> str:
        """The backend's name."""
        return self._sync.backend

    @property
    def state(self) -> SessionState:
        """The session's current state."""
        return self._sync.state

    server_version = awaited(sync.Session.server_version)
    describe_group = awaited(sync.Session.describe_group)

    def group(self, name: str) -> AsyncGroup:
        """The group ``name``."""
        return AsyncGroup(self._sync.group(name), self._loop)

    def election(self, service: str) -> AsyncElection:
        """The election for ``service``."""
        return AsyncElection(self._sync.election(service), self._loop)

    def lock(self, name: str, *, shared: bool = False) -> AsyncLock:
        """The fenced lock ``name``, like ``Session.lock``; ``shared``: a reader lock."""
        return AsyncLock(self._sync.lock(name, shared=shared), self._loop)

    def states(self) -> EventStream[SessionState]:
        """The session's states: the current one first, then every change (a loss is never
        coalesced away); ends after CLOSED."""
        session = self._sync
        return self._loop.stream(
            session.add_state_listener,
            session.remove_state_listener,
            sticky=lambda state: state is SessionState.LOST,
            current=lambda: session.state,
        )

    async def coordinator(
        self,
        group: str,
        protocol_type: str,
        handler: AsyncCoordinatorHandler,
        *,
        rebalance_timeout: float | None = None,
        group_instance_id: str | None = None,
    ) -> AsyncCoordinator:
        """A member of ``group`` in the rebalance protocol, like ``Session.coordinator``; the
        handler's callbacks may be ``async def`` and run on this loop (each bounded by the
        rebalance timeout)."""
        require_callbacks(handler, HANDLER_METHODS, "handler", "CoordinatorHandler")
        limit = rebalance_timeout or DEFAULT_REBALANCE_TIMEOUT
        create = partial(
            self._sync.coordinator,
            group,
            protocol_type,
            on_loop_handler(handler, self._loop.bridge.loop, limit),
            rebalance_timeout=rebalance_timeout,
            group_instance_id=group_instance_id,
        )
        return AsyncCoordinator(await self._loop.bridge.run(create), self._loop)

    async def incremental_coordinator(
        self,
        group: str,
        resources: Iterable[str],
        listener: AsyncResourceListener,
        *,
        assignor: str | Assignor = "sticky",
        rebalance_timeout: float | None = None,
        group_instance_id: str | None = None,
    ) -> AsyncIncrementalCoordinator:
        """Like ``Session.incremental_coordinator``; the listener's callbacks may be ``async def``
        and run on this loop."""
        check_resource_listener(listener)
        limit = rebalance_timeout or DEFAULT_REBALANCE_TIMEOUT
        create = partial(
            self._sync.incremental_coordinator,
            group,
            list(resources),
            on_loop_listener(listener, self._loop.bridge.loop, limit),
            assignor=assignor,
            rebalance_timeout=rebalance_timeout,
            group_instance_id=group_instance_id,
        )
        return AsyncIncrementalCoordinator(await self._loop.bridge.run(create), self._loop)

    async def close(self) -> None:
        """Close like ``Session.close``; every event stream stops after its held events. Idempotent."""
        bridge = self._loop.bridge
        try:
            await bridge.run(self._sync.close)
        finally:
            self._loop.end_streams()
            bridge.shutdown()
            if self._native is not None:
                await self._native.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"<AsyncSession {self.url.redacted()} {self.state.name}>"


class AsyncStorage(SessionTwin[Storage]):
    """``Storage`` as awaitables: same arguments, checks, results and errors. Where the backend has
    an asyncio face of its own (``Backend.async_storage``: ``NativeStorage``), every call but
    ``walk`` awaits it on the loop, with no thread and no cap on calls in flight; elsewhere the
    calls the session's ``Inline`` names run on the loop itself where the backend answers them
    without waiting (SQLite), and the rest on a worker."""

    def __init__(
        self, storage: Storage, loop: SessionLoop, inline: Inline, native: NativeStorage | None
    ) -> None:
        super().__init__(storage, loop)
        self._inline = inline
        self._native = native

    async def fetch(self, key: str) -> Versioned | None:
        """The value and version of ``key``, or None."""
        if self._native is not None:
            return await self._native.fetch(key)
        storage, bridge = self._sync, self._loop.bridge
        if not self._inline.reads:
            return await bridge.run(partial(storage.fetch, key))
        return await bridge.run_nowait(partial(storage.fetch_nowait, key), partial(storage.fetch, key))

    async def put(self, key: str, value: bytes, *, fence: Leadership | Lease | None = None) -> int:
        """Create ``key``; returns the new version."""
        if self._native is not None:
            return await _in_flight("put", self._native.put(key, value, fence))
        storage = self._sync
        return await self._write("put", storage.put, storage.put_nowait, key, value, fence=fence)

    async def update(
        self, key: str, value: bytes, *, version: int | None = None, fence: Leadership | Lease | None = None
    ) -> int:
        """Replace the value of ``key``, if at ``version`` when given; returns the new version."""
        if self._native is not None:
            return await _in_flight("update", self._native.update(key, value, version, fence))
        storage = self._sync
        return await self._write(
            "update", storage.update, storage.update_nowait, key, value, version=version, fence=fence
        )

    async def delete(
        self, key: str, *, version: int | None = None, fence: Leadership | Lease | None = None
    ) -> None:
        """Remove ``key``, if at ``version`` when given."""
        if self._native is not None:
            await _in_flight("delete", self._native.delete(key, version, fence))
            return
        storage = self._sync
        await self._write("delete", storage.delete, storage.delete_nowait, key, version=version, fence=fence)

    async def _write(
        self, what: str, call: Callable[..., T], nowait: Callable[..., T], *args: Any, **kwargs: Any
    ) -> T:
        bridge = self._loop.bridge
        if not self._inline.writes:
            return await bridge.run(partial(call, *args, **kwargs), write=what)
        return await bridge.run_nowait(
            partial(nowait, *args, **kwargs), partial(call, *args, **kwargs), write=what
        )

    async def keys(self, namespace: str = "") -> frozenset[str]:
        """The keys one level below ``namespace``."""
        if self._native is not None:
            return await self._native.keys(namespace)
        storage, bridge = self._sync, self._loop.bridge
        if not self._inline.reads:
            return await bridge.run(partial(storage.keys, namespace))
        return await bridge.run_nowait(
            partial(storage.keys_nowait, namespace), partial(storage.keys, namespace)
        )

    def walk(self, namespace: str = "") -> AsyncIterator[tuple[str, Versioned]]:
        """Every key below ``namespace`` with its value, as ``Storage.walk`` (same guarantees),
        fetched in batches on the pool."""
        return self._walk(check_namespace(namespace))

    async def _walk(self, namespace: str) -> AsyncIterator[tuple[str, Versioned]]:
        bridge = self._loop.bridge
        pages = await bridge.run(partial(self._sync.walk, namespace))
        while batch := await bridge.run(lambda: list(itertools.islice(pages, WALK_BATCH))):
            for item in batch:
                yield item


async def _in_flight(what: str, write: Coroutine[Any, Any, T]) -> T:
    """Await ``write`` (``what``); cancelled while in flight, its effect is unknown (as ``Bridge.run``)."""
    try:
        return await write
    except asyncio.CancelledError as cancelled:
        raise cancelled_in_flight(what) from cancelled


class AsyncListeners(SessionTwin[ListenerRegistry]):
    """Value and key-set events as async iterators (``async for event in ...watch(key)``)."""

    def watch(self, key: str) -> EventStream[ValueChanged]:
        """The value of ``key`` now, then after every change (coalesced for a slow consumer)."""
        key = check_key(key)
        listeners = self._sync
        return self._loop.stream(
            partial(listeners.add_value_listener, key), partial(listeners.remove_value_listener, key)
        )

    def watch_keys(self, namespace: str) -> EventStream[KeySetChanged]:
        """The keys one level below ``namespace`` now, then after every change."""
        namespace = check_namespace(namespace)
        listeners = self._sync
        return self._loop.stream(
            partial(listeners.add_keyset_listener, namespace),
            partial(listeners.remove_keyset_listener, namespace),
        )
