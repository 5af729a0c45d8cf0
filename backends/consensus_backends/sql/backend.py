"""The SQL backend: SQLite (a shared file, WAL mode), PostgreSQL (psycopg 3), MySQL/MariaDB (PyMySQL).

Guarantees beyond the Backend contract: lease expiry is judged by the
database clock only; every session reaps expired leases at each heartbeat
(every ``session_timeout / 3``, earlier when another lease expires sooner), so
while any session lives a dead one's members and candidates go when its lease
expires (``session_timeout`` after its last renewal) plus ``REAP_SLACK`` and
one transaction; every transaction that writes starts with the database's
write lock (SQLite ``BEGIN IMMEDIATE``) or locks the rows it decides on
(PostgreSQL, MySQL/MariaDB), so fenced writes and elections are atomic. A transaction spans
nothing but its own statements (no callback, no other I/O), so it holds its
locks for as long as its statements run, unless its process stalls inside it:
PostgreSQL and MariaDB then end it after ``engine.stall_limit`` (MariaDB: in
whole seconds, at least 1; MySQL only at ``wait_timeout``); SQLite cannot, and every
write waits until that process resumes or dies (calls fail with
``OperationTimeoutError`` naming the holder, sessions go SUSPENDED, then LOST).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any, TypeVar

import sqlalchemy
from sqlalchemy import Connection, Engine

from consensus_api.backend import AsyncStorage, Backend, Reader, Target, Writer
from consensus_api.config import BackendURL, boolean, seconds
from consensus_api.deferred_face import DeferredAsyncStorage
from consensus_api.errors import (
    BackendUnavailableError,
    OperationTimeoutError,
)
from consensus_api.model import Leadership, Versioned
from consensus_backends.sql import election, membership, storage
from consensus_backends.sql.changes import ChangeFeed
from consensus_backends.sql.client import MIN_CONNECT_LEFT, begin_sqlite, calls_until, create
from consensus_backends.sql.filecheck import unusable_file
from consensus_backends.sql.layout import Tables, table_prefix
from consensus_backends.sql.lease import Lease, drop_sessions, reap_expired
from consensus_backends.sql.nowait import NowaitStore
from consensus_backends.sql.outcome import Progress, connect_failure, no_connection, transaction_failure
from consensus_backends.sql.rereads import ChangeReader
from consensus_backends.sql.seal import read_live_sessions, read_sealed, read_term_ceiling, set_sealed
from consensus_backends.sql.watchdog import Watchdog
from consensus_backends.sql.writelock import begin_eagerly

log = logging.getLogger("consensus_api.sql")

R = TypeVar("R")
RETRY_PAUSE = 0.05
#: A heartbeat connects while any time is left before the lease lapses (a restarted server is
#: back in milliseconds); against a server that stopped answering, LOST may then come up to
#: libpq's minimum connect timeout (2 s) late.
HEARTBEAT_CONNECT_LEFT = 0.05

#: Keys per page of ``walk``.
WALK_PAGE = 500
#: PostgreSQL's asyncio storage (psycopg's and SQLAlchemy's asyncio), imported off the loop when used.
AIO_MODULE = "consensus_backends.sql.aio"


class SQLBackend(Backend):
    """Coordination state in SQL tables; see the module docstring for guarantees."""

    options = {
        "table_prefix": table_prefix,
        "poll_interval": seconds(0.001, 60.0),
        "tls": boolean,  # enables the common security options (<https://consensus-api.github.io/consensus-api/spec/#2-connecting>)
    }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        extra = self.settings.extra
        self._engine: Engine = create(self.url, self.settings)
        self._guarded = self._engine.dialect.name != "sqlite"
        #: PostgreSQL reads run without BEGIN and COMMIT (two round trips fewer): each is one
        #: statement, or statements at READ COMMITTED, which see what a transaction's would.
        self._autocommit_reads = self._engine.dialect.name == "postgresql"
        self._watchdog = Watchdog()
        self._tables = Tables(str(extra.get("table_prefix", "consensus_")))
        self._lease = Lease(
            self._tables,
            self.settings,
            self.events,
            database_file=None if self._guarded else self._engine.url.database,
            transact=self._transact_once,
            file_replaced=self._file_replaced,
            reopened=self._reopened,
        )
        self._nowait = (
            None if self._guarded else NowaitStore(self._tables, self._lease.renew_in, self._lease.renewed)
        )
        timeout = self.settings.request_timeout
        rereads = self._autocommit_reads
        self._rereads = ChangeReader(self._engine, self._tables, self._watchdog, timeout) if rereads else None
        self._lock = threading.Lock()
        self._watched: set[Target] = set()
        self._closed = False
        self._feed = ChangeFeed(
            self._engine,
            self._tables,
            self._hint,
            self._resync,
            float(extra.get("poll_interval", 0.025 if self._guarded else 0.01)),  # type: ignore[arg-type]
        )

    @property
    def name(self) -> str:
        return self._engine.dialect.name

    @classmethod
    def missing_storage(cls, url: BackendURL) -> str | None:
        """A SQLite file that does not exist yet (opening creates it); servers create nothing."""
        path = url.path[1:]
        return path if url.scheme == "sqlite" and path and not os.path.exists(path) else None

    def open(self) -> None:
        database = None if self._guarded else self._engine.url.database
        unusable = unusable_file(database) if database else None
        if unusable is not None:  # no retry heals it: unavailable at once, not after connect_timeout
            raise BackendUnavailableError(f"cannot open {self.url.redacted()}: {unusable}")
        deadline = time.monotonic() + self.settings.connect_timeout
        while True:
            try:
                self._run(self._start_session, deadline=deadline)
                break
            except (OperationTimeoutError, BackendUnavailableError) as exc:
                if time.monotonic() >= deadline:
                    self._engine.dispose()
                    raise BackendUnavailableError(
                        f"cannot reach {self.url.redacted()} within {self.settings.connect_timeout} s: {exc}"
                    ) from None
                time.sleep(RETRY_PAUSE)
        if self._nowait is not None:
            self._nowait.open(self._engine)
        self._lease.opened()
        self._feed.start()
        self._lease.start()

    def _start_session(self, conn: Connection) -> None:
        self._tables.create(conn)
        self._lease.create(conn)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._lease.stop(self.settings.request_timeout)
        self._feed.stop(self.settings.request_timeout)
        try:
            self._run(lambda c: drop_sessions(c, self._tables, [self._lease.session_id]))
        except (OperationTimeoutError, BackendUnavailableError) as exc:
            log.warning("could not release the session at close (%s); it expires by itself", exc)
        finally:
            if self._nowait is not None:
                self._nowait.close()
            if self._rereads is not None:
                self._rereads.close()
            self._engine.dispose()

    def change_reader(self) -> Reader:
        """PostgreSQL: one held autocommit connection (``rereads``); elsewhere the backend itself."""
        return self._rereads or self

    def nowait_reader(self) -> Reader | None:
        """SQLite: reads on a held WAL connection that never wait (``nowait``); elsewhere None."""
        return self._nowait

    def async_storage(self) -> AsyncStorage | None:
        """PostgreSQL: psycopg's asyncio API (``sql.aio``); None for SQLite (``nowait_*``) and MariaDB."""
        build = lambda aio: aio.PostgreSQLStorage(self, self._engine, self._tables)  # noqa: E731
        return DeferredAsyncStorage(AIO_MODULE, build) if self._engine.dialect.name == "postgresql" else None

    def nowait_writer(self) -> Writer | None:
        """SQLite: writes on the same connection that begin only if the write lock is free at once
        (``nowait``); elsewhere None."""
        return self._nowait

    # Storage

    def fetch(self, key: str) -> Versioned | None:
        return self._run(lambda c: storage.fetch(c, self._tables, key), write=False)

    def put(self, key: str, value: bytes, fence: Leadership | None) -> int:
        return self._run(lambda c: storage.put(c, self._tables, key, value), fence=fence)

    def update(self, key: str, value: bytes, version: int | None, fence: Leadership | None) -> int:
        return self._run(lambda c: storage.update_value(c, self._tables, key, value, version), fence=fence)

    def delete(self, key: str, version: int | None, fence: Leadership | None) -> None:
        self._run(lambda c: storage.delete(c, self._tables, key, version), fence=fence)

    def keys(self, namespace: str) -> frozenset[str]:
        return self._run(lambda c: storage.keys(c, self._tables, namespace), write=False)

    def walk(self, namespace: str) -> Iterator[tuple[str, Versioned]]:
        """Keyset pagination in primary-key order: each page is one read-only transaction."""
        after: str | None = None
        while True:
            page = self._run(
                partial(storage.walk_page, t=self._tables, namespace=namespace, after=after, limit=WALK_PAGE),
                write=False,
            )
            yield from page
            if len(page) < WALK_PAGE:
                return
            after = page[-1][0]

    # Membership and election

    def join(self, group: str, member_id: str, data: bytes) -> None:
        self._run(lambda c: membership.join(c, self._tables, self._lease.session_id, group, member_id, data))

    def leave(self, group: str, member_id: str) -> None:
        self._run(lambda c: membership.leave(c, self._tables, self._lease.session_id, group, member_id))

    def membership(self, group: str) -> dict[str, bytes]:
        return self._run(lambda c: membership.membership(c, self._tables, group), write=False)

    def nominate(self, service: str, candidate_id: str) -> bool:
        def work(conn: Connection) -> bool:
            reap_expired(conn, self._tables)
            return election.nominate(conn, self._tables, self._lease.session_id, service, candidate_id)

        return self._run(work)

    def resign(self, service: str, candidate_id: str) -> None:
        self._run(lambda c: election.resign(c, self._tables, self._lease.session_id, service, candidate_id))

    def leadership(self, service: str) -> Leadership | None:
        return self._run(lambda c: election.leadership(c, self._tables, service), write=False)

    # Watches

    def watch(self, target: Target) -> None:
        with self._lock:
            self._watched.add(target)

    def unwatch(self, target: Target) -> None:
        with self._lock:
            self._watched.discard(target)

    # Migration (``seal``: the seal row; the highest term of the leaders table; the lease rows)

    def term_ceiling(self) -> int:
        return self._run(lambda c: read_term_ceiling(c, self._tables), write=False)

    def seal(self) -> None:
        self._run(lambda c: set_sealed(c, self._tables, True))

    def unseal(self) -> None:
        self._run(lambda c: set_sealed(c, self._tables, False))

    def sealed(self) -> bool:
        return self._run(lambda c: read_sealed(c, self._tables), write=False)

    def session_identity(self) -> str:
        return self._lease.session_id

    def live_sessions(self) -> frozenset[str]:
        return self._run(lambda c: read_live_sessions(c, self._tables), write=False)

    def server_version(self) -> str | None:
        """The server's version (PostgreSQL, MySQL/MariaDB), or the SQLite library's (read at connect)."""
        version = self._engine.dialect.server_version_info
        return None if version is None else ".".join(str(part) for part in version)

    def fault_identity(self) -> dict[str, object]:
        """The session's lease row: ``{"sessions_table": name, "session_id": id}``, and with TLS the file
        options ``tls_ca``, ``tls_cert``, ``tls_key`` (paths) to reach the server (tests only)."""
        identity: dict[str, object] = {
            "sessions_table": self._tables.sessions.name,
            "session_id": self._lease.session_id,
        }
        security = self.settings.security
        if security.tls:
            identity["tls"] = {name: getattr(security, name) for name in ("tls_ca", "tls_cert", "tls_key")}
        return identity

    def _hint(self, target: Target) -> None:
        with self._lock:
            watched = target in self._watched
        if watched:
            self.events.changed(target)

    def _resync(self) -> None:
        with self._lock:
            targets = list(self._watched)
        for target in targets:
            self.events.changed(target)

    # The lease's calls

    def _transact_once(self, work: Callable[[Connection], R], deadline: float) -> R:
        """One transaction of the heartbeat (``lease.Transact``): tried once, by ``deadline``."""
        return self._run(work, deadline=deadline, retry=False)

    def _file_replaced(self) -> None:
        """SQLite's file was deleted or replaced (the lease reported LOST): let go of the old one."""
        self._engine.dispose()  # pooled connections still write to the old file
        if self._nowait is not None:
            self._nowait.close()  # held, so not disposed: inline reads go to workers meanwhile
        self._feed.rewind()

    def _reopened(self) -> None:
        """The lease opened a new row after a loss: hold the nowait connection again if it was let go."""
        if self._nowait is not None and not self._nowait.is_open():
            self._nowait.open(self._engine)

    # Transactions

    def _run(
        self,
        work: Callable[[Connection], R],
        *,
        write: bool = True,
        fence: Leadership | None = None,
        deadline: float | None = None,
        retry: bool = True,
    ) -> R:
        """Run ``work`` in one transaction, retrying what is safe to retry until ``deadline``.

        Safe to retry: a failure to connect, a deadlock or serialization failure,
        and a broken connection before the commit was sent (the database rolls
        back what was not committed; a pooled connection may be stale after a
        server restart). Without ``retry`` (the heartbeat, which is a retry loop
        itself) only deadlocks and serialization failures are retried. A call
        that outlives ``deadline`` has its connection cut (``Watchdog``):
        ``OperationTimeoutError``, with ``not_applied`` when no COMMIT was sent
        (also SQLite's ``BEGIN IMMEDIATE`` that never got the write lock, which
        is retried until ``deadline``; see ``writelock``).
        """
        deadline = deadline or time.monotonic() + self.settings.request_timeout
        while True:
            try:
                with calls_until(deadline, MIN_CONNECT_LEFT if retry else HEARTBEAT_CONNECT_LEFT):
                    conn = self._engine.connect()
                    if not write and self._autocommit_reads:  # the pool resets it on return
                        conn.execution_options(isolation_level="AUTOCOMMIT")
            except sqlalchemy.exc.DBAPIError as exc:
                again, error = connect_failure(exc, self.url.redacted(), self._engine)
                if again and retry and time.monotonic() + RETRY_PAUSE < deadline:
                    time.sleep(RETRY_PAUSE)
                    continue
                raise error from None
            except sqlalchemy.exc.TimeoutError:
                raise no_connection(self.name) from None
            guard = self._watchdog.arm(conn.connection.dbapi_connection, deadline) if self._guarded else None
            progress, cut = Progress(), False
            try:
                with conn:
                    try:
                        return self.transact(
                            conn, work, progress, write=write, fence=fence, retry=retry, deadline=deadline
                        )
                    finally:  # before the connection goes back to the pool, where another call may take it
                        cut = guard is not None and self._watchdog.disarm(guard)
            except sqlalchemy.exc.DBAPIError as exc:
                again, error = transaction_failure(
                    exc, progress, self.name, self._engine, retry=retry, cut=cut
                )
                if again and time.monotonic() + RETRY_PAUSE < deadline:
                    time.sleep(RETRY_PAUSE)
                    continue
                raise error from None

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
    ) -> R:
        """One transaction on ``conn`` (of ``_run``, and of PostgreSQL's asyncio storage on its own
        connections): begin, renew the lease in a SQLite write, check ``fence``, ``work``, commit;
        ``progress`` tells a failure how far it got (``outcome``)."""
        with conn.begin():
            if write and not retry and not self._guarded:  # SQLite's heartbeat write: eager (writelock)
                begin_eagerly(conn, deadline, self.settings.request_timeout)
            else:
                begin_sqlite(conn, write)
            progress.begun = True
            renewing = self._lease.renew_in(conn) if write and retry else None
            if fence is not None:
                election.check_fence(conn, self._tables, fence)
            result = work(conn)
            progress.committing = True
        if renewing is not None:
            self._lease.renewed(renewing)
        return result
