"""The asyncio session: the synchronous core's contract as awaitables and async iterators."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable, Generator, Iterable
from dataclasses import dataclass
from functools import partial
from types import TracebackType
from typing import Any, Self, TypeVar

from consensus_api import session as sync
from consensus_api.aio._bridge import Bridge, EventStream, check_workers
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
from consensus_api.assignors import Assignor
from consensus_api.config import BackendURL
from consensus_api.coordinator.core import HANDLER_METHODS
from consensus_api.coordinator.handler import check_resource_listener, require_callbacks
from consensus_api.coordinator.member import DEFAULT_REBALANCE_TIMEOUT
from consensus_api.errors import ConfigurationError
from consensus_api.keys import check_key, check_namespace
from consensus_api.listeners import ListenerRegistry
from consensus_api.model import KeySetChanged, Leadership, SessionState, ValueChanged, Versioned

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
        return AsyncSession(opened, bridge, inline)

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


class AsyncSession:
    """A :class:`consensus_api.Session` for asyncio code: every call that may block is awaited
    (it runs on the session's thread pool), events are async iterators. Same guarantees as the
    synchronous session; ``async with`` closes it on exit."""

    def __init__(self, session: sync.Session, bridge: Bridge, inline: Inline) -> None:
        self._session = session
        self._bridge = bridge
        self._streams: set[EventStream[Any]] = set()
        self.storage = AsyncStorage(session, bridge, inline)
        self.listeners = AsyncListeners(session.listeners, self._stream)

    @property
    def url(self) -> BackendURL:
        """The session's URL (``redacted()`` for display)."""
        return self._session.url

    @property
    def backend(self) -> str:
        """The backend's name."""
        return self._session.backend

    @property
    def state(self) -> SessionState:
        """The session's current state."""
        return self._session.state

    async def server_version(self) -> str | None:
        """The version the server reports, or None where the backend cannot tell."""
        return await self._bridge.run(self._session.server_version)

    def group(self, name: str) -> AsyncGroup:
        """The group ``name``."""
        return AsyncGroup(self._session.group(name), self)

    def election(self, service: str) -> AsyncElection:
        """The election for ``service``."""
        return AsyncElection(self._session.election(service), self)

    def states(self) -> EventStream[SessionState]:
        """The session's states: the current one first, then every change (a loss is never
        coalesced away); ends after CLOSED."""
        return self._stream(
            self._session.add_state_listener,
            self._session.remove_state_listener,
            sticky=lambda state: state is SessionState.LOST,
            current=lambda: self._session.state,
        )

    async def coordinator(
        self,
        group: str,
        protocol_type: str,
        handler: AsyncCoordinatorHandler,
        *,
        rebalance_timeout: float | None = None,
    ) -> AsyncCoordinator:
        """A member of ``group`` in the rebalance protocol, like ``Session.coordinator``; the
        handler's callbacks may be ``async def`` and run on this loop (each bounded by the
        rebalance timeout)."""
        require_callbacks(handler, HANDLER_METHODS, "handler", "CoordinatorHandler")
        limit = rebalance_timeout or DEFAULT_REBALANCE_TIMEOUT
        adapted = on_loop_handler(handler, self._bridge, limit)
        create = partial(
            self._session.coordinator, group, protocol_type, adapted, rebalance_timeout=rebalance_timeout
        )
        return AsyncCoordinator(await self._bridge.run(create), self._bridge)

    async def incremental_coordinator(
        self,
        group: str,
        resources: Iterable[str],
        listener: AsyncResourceListener,
        *,
        assignor: str | Assignor = "sticky",
        rebalance_timeout: float | None = None,
    ) -> AsyncIncrementalCoordinator:
        """Like ``Session.incremental_coordinator``; the listener's callbacks may be ``async def``
        and run on this loop."""
        check_resource_listener(listener)
        limit = rebalance_timeout or DEFAULT_REBALANCE_TIMEOUT
        create = partial(
            self._session.incremental_coordinator,
            group,
            list(resources),
            on_loop_listener(listener, self._bridge, limit),
            assignor=assignor,
            rebalance_timeout=rebalance_timeout,
        )
        return AsyncIncrementalCoordinator(await self._bridge.run(create), self._bridge)

    async def close(self) -> None:
        """Close like ``Session.close``; every event stream stops after its held events. Idempotent."""
        try:
            await self._bridge.run(self._session.close)
        finally:
            for stream in list(self._streams):
                stream.finish()
            self._bridge.shutdown()

    def _stream(self, subscribe: Any, unsubscribe: Any, **behaviour: Any) -> EventStream[Any]:
        """A new event stream of this session, ended when the session closes (at once if it is)."""
        created: EventStream[Any] = EventStream(
            self._bridge, subscribe, unsubscribe, on_finish=self._streams.discard, **behaviour
        )
        if self._session.state is SessionState.CLOSED:
            created.finish()
        else:
            self._streams.add(created)
        return created

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"<AsyncSession {self._session.url.redacted()} {self.state.name}>"


class AsyncStorage:
    """``Storage`` as awaitables: same arguments, checks, results and errors. Calls the session's
    ``Inline`` names run on the loop itself where the backend answers them without waiting
    (SQLite), else on a worker."""

    def __init__(self, session: sync.Session, bridge: Bridge, inline: Inline) -> None:
        self._storage = session.storage
        self._bridge = bridge
        self._inline = inline

    async def fetch(self, key: str) -> Versioned | None:
        """The value and version of ``key``, or None."""
        storage = self._storage
        if not self._inline.reads:
            return await self._bridge.run(partial(storage.fetch, key))
        return await self._bridge.run_nowait(partial(storage.fetch_nowait, key), partial(storage.fetch, key))

    async def put(self, key: str, value: bytes, *, fence: Leadership | None = None) -> int:
        """Create ``key``; returns the new version."""
        return await self._write("put", self._storage.put, self._storage.put_nowait, key, value, fence=fence)

    async def update(
        self, key: str, value: bytes, *, version: int | None = None, fence: Leadership | None = None
    ) -> int:
        """Replace the value of ``key``, if at ``version`` when given; returns the new version."""
        storage = self._storage
        return await self._write(
            "update", storage.update, storage.update_nowait, key, value, version=version, fence=fence
        )

    async def delete(self, key: str, *, version: int | None = None, fence: Leadership | None = None) -> None:
        """Remove ``key``, if at ``version`` when given."""
        storage = self._storage
        await self._write("delete", storage.delete, storage.delete_nowait, key, version=version, fence=fence)

    async def _write(
        self, what: str, call: Callable[..., T], nowait: Callable[..., T], *args: Any, **kwargs: Any
    ) -> T:
        if not self._inline.writes:
            return await self._bridge.run(partial(call, *args, **kwargs), write=what)
        return await self._bridge.run_nowait(
            partial(nowait, *args, **kwargs), partial(call, *args, **kwargs), write=what
        )

    async def keys(self, namespace: str = "") -> frozenset[str]:
        """The keys one level below ``namespace``."""
        storage = self._storage
        if not self._inline.reads:
            return await self._bridge.run(partial(storage.keys, namespace))
        return await self._bridge.run_nowait(
            partial(storage.keys_nowait, namespace), partial(storage.keys, namespace)
        )

    def walk(self, namespace: str = "") -> AsyncIterator[tuple[str, Versioned]]:
        """Every key below ``namespace`` with its value, as ``Storage.walk`` (same guarantees),
        fetched in batches on the pool."""
        return self._walk(check_namespace(namespace))

    async def _walk(self, namespace: str) -> AsyncIterator[tuple[str, Versioned]]:
        pages = await self._bridge.run(partial(self._storage.walk, namespace))
        while batch := await self._bridge.run(lambda: list(itertools.islice(pages, WALK_BATCH))):
            for item in batch:
                yield item


class AsyncListeners:
    """Value and key-set events as async iterators (``async for event in ...watch(key)``)."""

    def __init__(self, listeners: ListenerRegistry, stream: Callable[..., EventStream[Any]]) -> None:
        self._listeners = listeners
        self._stream = stream

    def watch(self, key: str) -> EventStream[ValueChanged]:
        """The value of ``key`` now, then after every change (coalesced for a slow consumer)."""
        key = check_key(key)
        listeners = self._listeners
        return self._stream(
            partial(listeners.add_value_listener, key), partial(listeners.remove_value_listener, key)
        )

    def watch_keys(self, namespace: str) -> EventStream[KeySetChanged]:
        """The keys one level below ``namespace`` now, then after every change."""
        namespace = check_namespace(namespace)
        listeners = self._listeners
        return self._stream(
            partial(listeners.add_keyset_listener, namespace),
            partial(listeners.remove_keyset_listener, namespace),
        )
