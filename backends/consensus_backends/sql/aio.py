"""PostgreSQL's storage over psycopg's asyncio API, for one event loop (``Backend.async_storage``).

Reads (``fetch``, ``keys``) are the backend's own statements (``statements``),
compiled once and sent by psycopg's ``AsyncConnection`` in autocommit and
prepared on the server, as ``rereads.ChangeReader`` sends them: one statement at
READ COMMITTED sees every commit that preceded it, so the read is linearizable
like the blocking one. They go over ``LANES`` connections of this loop, each
read on the lane with the fewest reads in flight, where psycopg's own lock
queues it: that costs a read what the raw client's call costs, where a
``psycopg_pool`` checkout cost 50 % more CPU with 1,000 reads waiting (a task
and a condition per waiting read; docs/performance.md). Writes are the
backend's own transaction (``SQLBackend.transact``: the fence check, the
statements of ``storage``, the change log and every check a write makes there),
run by SQLAlchemy's asyncio engine on psycopg's ``AsyncConnection``
(``run_sync``), with the blocking calls' retries and error translation
(``outcome``): one SQL, one set of rules, awaited on the loop. No thread is
involved and nothing but the connections' number bounds the calls in flight
(the rest wait on the loop). Every call ends within ``request_timeout``: then
its connection's socket is cut (``watchdog.cut``, as the blocking calls'
``Watchdog`` does; cancelling psycopg's wait instead would have it ask the
server to cancel and wait for that, up to 10 s more), and it raises
``OperationTimeoutError``, for a write saying whether its COMMIT had been
sent. The connections have the blocking ones' settings
(``client.postgresql_parameters``: ``statement_timeout`` and the rest).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import psycopg
import sqlalchemy
from sqlalchemy import Connection, Engine
from sqlalchemy.ext.asyncio import create_async_engine

from consensus_api.config import BackendURL, Options
from consensus_api.errors import BackendUnavailableError, PermissionDeniedError
from consensus_api.model import Leadership, Versioned
from consensus_backends.sql import statements, storage
from consensus_backends.sql.client import postgresql_parameters
from consensus_backends.sql.errors import denied, describe_error, is_retryable
from consensus_backends.sql.layout import Tables
from consensus_backends.sql.outcome import (
    Progress,
    connect_failure,
    no_connection,
    transaction_failure,
    unfinished,
)
from consensus_backends.sql.watchdog import cut

R = TypeVar("R")


class Transacting(Protocol):
    """What the face needs of its ``SQLBackend``: its name, URL, settings and own transaction."""

    url: BackendURL
    settings: Options

    @property
    def name(self) -> str: ...

    def transact(
        self,
        conn: Connection,
        work: Callable[[Connection], R],
        progress: Progress,
        *,
        write: bool,
        fence: Leadership | None,
        retry: bool,
        deadline: float,
    ) -> R: ...


#: Connections for reads: the server's two cores are kept busy by four.
LANES = 4
#: Connections of the writes' pool, as the blocking calls' pool keeps.
POOL_SIZE = 8
#: Writes beyond ``POOL_SIZE`` get connections of their own, up to this many more, as blocking ones do.
WRITE_OVERFLOW = 24
#: The pause before a read or write is tried again (a broken connection, a serialization failure).
RETRY_PAUSE = 0.05
TIMED_OUT = "no answer within request_timeout"


class PostgreSQLStorage:
    """``consensus_api.backend.AsyncStorage`` of one ``SQLBackend`` on PostgreSQL, for the running
    loop; see the module docstring. Connects on the first call."""

    def __init__(self, backend: Transacting, engine: Engine, tables: Tables) -> None:
        self._backend = backend
        self._engine = engine
        self._tables = tables
        self._loop = asyncio.get_running_loop()
        self._timeout = backend.settings.request_timeout
        prepared = statements.for_dialect(tables, engine.dialect.name)
        self._sql = {
            read: str(getattr(prepared, read).compile(dialect=engine.dialect)) for read in ("fetch", "keys")
        }
        parameters = postgresql_parameters(backend.settings)
        _, target = engine.dialect.create_connect_args(engine.url)
        self._lanes = [_Lane({**target, **parameters}) for _ in range(LANES)]
        self._writes = create_async_engine(
            engine.url,
            connect_args=parameters,
            pool_size=POOL_SIZE,
            max_overflow=WRITE_OVERFLOW,
            pool_timeout=self._timeout,
        )
        self._closed = False

    async def fetch(self, key: str) -> Versioned | None:
        rows = await self._read("fetch", {"b_key": key})
        return storage.versioned(rows[0] if rows else None)

    async def keys(self, namespace: str) -> frozenset[str]:
        return storage.key_set(await self._read("keys", {"b_parent": namespace}))

    async def put(self, key: str, value: bytes, fence: Leadership | None) -> int:
        return await self._write(lambda c: storage.put(c, self._tables, key, value), fence)

    async def update(self, key: str, value: bytes, version: int | None, fence: Leadership | None) -> int:
        return await self._write(lambda c: storage.update_value(c, self._tables, key, value, version), fence)

    async def delete(self, key: str, version: int | None, fence: Leadership | None) -> None:
        await self._write(lambda c: storage.delete(c, self._tables, key, version), fence)

    async def aclose(self) -> None:
        """Close every connection (a call in flight fails). Idempotent."""
        if self._closed:
            return
        self._closed = True
        for lane in self._lanes:
            await lane.close()
        await self._writes.dispose()

    async def _read(self, read: str, params: dict[str, str]) -> list[Any]:
        """The statement's rows; a failed connection (a server restart) or a rolled-back statement
        is tried again until ``request_timeout``, as the blocking read is."""
        deadline = self._loop.time() + self._timeout
        while True:
            if self._closed:
                raise BackendUnavailableError("the session's asyncio storage is closed")
            lane = min(self._lanes, key=_Lane.load)
            try:
                return await lane.rows(self._sql[read], params, deadline)
            except TimeoutError:
                raise unfinished(self._backend.name, Progress(), TIMED_OUT) from None
            except psycopg.Error as exc:
                if denied(exc):
                    raise PermissionDeniedError(
                        f"{self._backend.name} refused the call ({describe_error(exc, self._engine)})"
                    ) from None
                again = isinstance(exc, psycopg.OperationalError) or is_retryable(exc)
                if again and self._loop.time() + RETRY_PAUSE < deadline:
                    await asyncio.sleep(RETRY_PAUSE)
                    continue
                if self._loop.time() >= deadline:
                    raise unfinished(self._backend.name, Progress(), TIMED_OUT) from None
                raise BackendUnavailableError(
                    f"cannot read from {self._backend.url.redacted()}: {describe_error(exc, self._engine)}"
                ) from None

    async def _write(self, work: Callable[[Connection], R], fence: Leadership | None) -> R:
        """``work`` in the backend's own transaction (``SQLBackend.transact``), retried and
        translated as ``SQLBackend._run`` does."""
        name, began = self._backend.name, self._loop.time()
        deadline = began + self._timeout
        while True:
            try:
                async with asyncio.timeout_at(deadline):
                    conn = await self._writes.connect()
            except TimeoutError:
                raise unfinished(name, Progress(), TIMED_OUT) from None
            except sqlalchemy.exc.TimeoutError:
                raise no_connection(name) from None
            except sqlalchemy.exc.DBAPIError as exc:
                again, error = connect_failure(exc, self._backend.url.redacted(), self._engine)
                if again and self._loop.time() + RETRY_PAUSE < deadline:
                    await asyncio.sleep(RETRY_PAUSE)
                    continue
                raise error from None
            progress = Progress()
            try:
                try:
                    raw = await conn.get_raw_connection()
                    watchdog = self._loop.call_at(deadline, cut, raw.driver_connection)
                    try:
                        return await conn.run_sync(
                            self._backend.transact,
                            work,
                            progress,
                            write=True,
                            fence=fence,
                            retry=True,
                            deadline=_monotonic(deadline, self._loop),
                        )
                    finally:
                        watchdog.cancel()
                finally:  # back to the pool (discarded there if its socket was cut)
                    await conn.close()
            except sqlalchemy.exc.DBAPIError as exc:
                late = self._loop.time() >= deadline
                again, error = transaction_failure(exc, progress, name, self._engine, retry=True, cut=late)
                if again and self._loop.time() + RETRY_PAUSE < deadline:
                    await asyncio.sleep(RETRY_PAUSE)
                    continue
                raise error from None


class _Lane:
    """One read connection, opened on first use and again after it failed; psycopg's lock queues
    the reads sent on it. A read still unanswered at its deadline has the connection's socket cut
    (``watchdog.cut``, as the blocking calls' ``Watchdog`` does): it and the reads queued behind it
    fail at once and are tried again on a new connection while they have time. One timer per lane
    watches its earliest deadline (a timer per read cost 15 µs with 1,000 queued: the loop's heap
    of timers)."""

    def __init__(self, parameters: dict[str, Any]) -> None:
        self._parameters = parameters
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._opening = asyncio.Lock()
        #: The deadline of every read on this lane, by ticket.
        self._deadlines: dict[object, float] = {}
        self._timer: asyncio.TimerHandle | None = None

    def load(self) -> int:
        """Reads sent or queued on this lane now."""
        return len(self._deadlines)

    async def rows(self, sql: str, params: dict[str, str], deadline: float) -> list[Any]:
        """``sql``'s rows, by ``deadline`` (the loop's clock) or ``TimeoutError``."""
        loop = asyncio.get_running_loop()
        ticket = object()
        self._deadlines[ticket] = deadline
        try:
            conn = self._conn
            if conn is None:
                async with asyncio.timeout_at(deadline):
                    conn = await self._open()
            if self._timer is None or deadline < self._timer.when():  # a retried read is older
                if self._timer is not None:
                    self._timer.cancel()
                self._timer = loop.call_at(deadline, self._watch)
            try:
                cursor = await conn.execute(sql, params, prepare=True)
                return await cursor.fetchall()
            except psycopg.OperationalError:
                if self._conn is conn:  # broken or cut: the next read opens another
                    self._conn = None
                await conn.close()
                if loop.time() >= deadline:
                    raise TimeoutError from None
                raise
        finally:
            del self._deadlines[ticket]

    def _watch(self) -> None:
        """The timer: cut the connection if its oldest read is past its deadline, else wait for
        that deadline (none while the lane is idle)."""
        self._timer = None
        if not self._deadlines:
            return
        loop = asyncio.get_running_loop()
        oldest = min(self._deadlines.values())
        if oldest > loop.time():
            self._timer = loop.call_at(oldest, self._watch)
        elif self._conn is not None:
            cut(self._conn)

    async def _open(self) -> psycopg.AsyncConnection[Any]:
        """The lane's connection, opened once for every read waiting for it."""
        async with self._opening:
            if self._conn is None:
                self._conn = await psycopg.AsyncConnection.connect(**self._parameters, autocommit=True)
            return self._conn

    async def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.close()


def _monotonic(deadline: float, loop: asyncio.AbstractEventLoop) -> float:
    """``deadline`` of ``loop``'s clock on ``time.monotonic()``'s (the clock ``transact`` takes)."""
    return time.monotonic() + (deadline - loop.time())
