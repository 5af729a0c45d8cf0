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

Test hook: with ``$CONSENSUS_TEST_STOP_IN_FENCED_WRITE`` set, the next fenced
write unsets it and stops its own process (SIGSTOP) after its statements,
before its commit: how the conformance suite freezes a client inside a
transaction. Nothing else reads it.
"""

from __future__ import annotations

import logging
import math
import os
import re
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

import sqlalchemy
from sqlalchemy import Connection, Engine

from consensus_api.backend import Backend, Target
from consensus_api.config import BackendURL, boolean, seconds
from consensus_api.errors import (
    BackendUnavailableError,
    ConfigurationError,
    OperationTimeoutError,
    SessionLostError,
)
from consensus_api.model import Leadership, SessionState, Versioned
from consensus_backends.sql import ephemeral, store
from consensus_backends.sql.changes import ChangeFeed, prune
from consensus_backends.sql.engine import (
    MIN_CONNECT_LEFT,
    Watchdog,
    begin_sqlite,
    calls_until,
    create,
    describe_error,
    is_retryable,
    permanent_connect_failure,
)
from consensus_backends.sql.filecheck import FileIdentity
from consensus_backends.sql.schema import Tables

if TYPE_CHECKING:
    from consensus_api.conformance.profile import TestProfile

log = logging.getLogger("consensus_api.sql")

R = TypeVar("R")
RETRY_PAUSE = 0.05
#: Seconds between heartbeats while the database is unreachable.
TROUBLE_PAUSE = 0.25
#: A heartbeat connects while any time is left before the lease lapses (a restarted server is
#: back in milliseconds); against a server that stopped answering, LOST may then come up to
#: libpq's minimum connect timeout (2 s) late.
HEARTBEAT_CONNECT_LEFT = 0.05
#: A heartbeat due to reap a lease comes this many seconds after the lease expires (database
#: clock); it is also the shortest pause between heartbeats, so they never spin.
REAP_SLACK = 0.01

#: Keys per page of ``walk``.
WALK_PAGE = 500

#: The test hook of the module docstring.
STOP_IN_FENCED_WRITE = "CONSENSUS_TEST_STOP_IN_FENCED_WRITE"


#: Table prefixes: they are spliced into SQL (table, trigger and LISTEN channel names) unquoted.
_TABLE_PREFIX_RE = re.compile(r"[A-Za-z0-9_]{1,40}")


def table_prefix(value: Any) -> str:
    """Parse a table prefix: 1-40 characters of A-Z a-z 0-9 _."""
    if not isinstance(value, str) or not _TABLE_PREFIX_RE.fullmatch(value):
        raise ValueError(f"expected 1-40 characters of A-Z a-z 0-9 _, got {value!r}")
    return value


class SQLBackend(Backend):
    """Coordination state in SQL tables; see the module docstring for guarantees."""

    options = {
        "table_prefix": table_prefix,
        "poll_interval": seconds(0.001, 60.0),
        "tls": boolean,  # enables the common security options (docs/spec.md section 2)
    }

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        extra = self.settings.extra
        self._engine: Engine = create(self.url, self.settings)
        self._guarded = self._engine.dialect.name != "sqlite"
        self._file = FileIdentity(None if self._guarded else self._engine.url.database)
        self._watchdog = Watchdog()
        self._tables = Tables(str(extra.get("table_prefix", "consensus_")))
        self._session_id = uuid.uuid4().hex
        self._lock = threading.Lock()
        self._watched: set[Target] = set()
        self._stop = threading.Event()
        self._feed = ChangeFeed(
            self._engine,
            self._tables,
            self._hint,
            self._resync,
            float(extra.get("poll_interval", 0.025)),  # type: ignore[arg-type]
        )
        self._heartbeat = threading.Thread(target=self._beat, name="consensus-sql-heartbeat", daemon=True)
        self._state_lock = threading.Lock()
        self._beat_state = SessionState.CONNECTED

    @property
    def name(self) -> str:
        return self._engine.dialect.name

    def open(self) -> None:
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
        self._file.arm()
        self._feed.start()
        self._heartbeat.start()

    def _start_session(self, conn: Connection) -> None:
        self._tables.create(conn)
        ephemeral.open_lease(conn, self._tables, self._session_id, self.settings.session_timeout)

    def close(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        self._heartbeat.join(self.settings.request_timeout)
        self._feed.stop(self.settings.request_timeout)
        try:
            self._run(lambda c: ephemeral.drop_sessions(c, self._tables, [self._session_id]))
        except (OperationTimeoutError, BackendUnavailableError) as exc:
            log.warning("could not release the session at close (%s); it expires by itself", exc)
        finally:
            self._engine.dispose()

    # Storage

    def fetch(self, key: str) -> Versioned | None:
        return self._run(lambda c: store.fetch(c, self._tables, key), write=False)

    def put(self, key: str, value: bytes, fence: Leadership | None) -> int:
        return self._run(lambda c: store.put(c, self._tables, key, value), fence=fence)

    def update(self, key: str, value: bytes, version: int | None, fence: Leadership | None) -> int:
        return self._run(lambda c: store.update_value(c, self._tables, key, value, version), fence=fence)

    def delete(self, key: str, version: int | None, fence: Leadership | None) -> None:
        self._run(lambda c: store.delete(c, self._tables, key, version), fence=fence)

    def keys(self, namespace: str) -> frozenset[str]:
        return self._run(lambda c: store.keys(c, self._tables, namespace), write=False)

    def walk(self, namespace: str) -> Iterator[tuple[str, Versioned]]:
        """Keyset pagination in primary-key order: each page is one read-only transaction."""
        after: str | None = None
        while True:
            page = self._run(
                partial(store.walk_page, t=self._tables, namespace=namespace, after=after, limit=WALK_PAGE),
                write=False,
            )
            yield from page
            if len(page) < WALK_PAGE:
                return
            after = page[-1][0]

    # Membership and election

    def join(self, group: str, member_id: str, data: bytes) -> None:
        def work(conn: Connection) -> None:
            ephemeral.reap_expired(conn, self._tables)
            ephemeral.join(conn, self._tables, self._session_id, group, member_id, data)

        self._run(work)

    def leave(self, group: str, member_id: str) -> None:
        self._run(lambda c: ephemeral.leave(c, self._tables, self._session_id, group, member_id))

    def membership(self, group: str) -> dict[str, bytes]:
        return self._run(lambda c: ephemeral.membership(c, self._tables, group), write=False)

    def nominate(self, service: str, candidate_id: str) -> bool:
        def work(conn: Connection) -> bool:
            ephemeral.reap_expired(conn, self._tables)
            return ephemeral.nominate(conn, self._tables, self._session_id, service, candidate_id)

        return self._run(work)

    def resign(self, service: str, candidate_id: str) -> None:
        self._run(lambda c: ephemeral.resign(c, self._tables, self._session_id, service, candidate_id))

    def leadership(self, service: str) -> Leadership | None:
        return self._run(lambda c: ephemeral.leadership(c, self._tables, service), write=False)

    # Watches

    def watch(self, target: Target) -> None:
        with self._lock:
            self._watched.add(target)

    def unwatch(self, target: Target) -> None:
        with self._lock:
            self._watched.discard(target)

    def server_version(self) -> str | None:
        """The server's version (PostgreSQL, MySQL/MariaDB), or the SQLite library's (read at connect)."""
        version = self._engine.dialect.server_version_info
        return None if version is None else ".".join(str(part) for part in version)

    @classmethod
    def test_profile(cls, url: BackendURL) -> TestProfile:
        """SQLite's, PostgreSQL's or MariaDB's (``consensus_backends.sql.profile``)."""
        from consensus_backends.sql import profile  # noqa: PLC0415 - only tests need it

        return profile.for_scheme(url.scheme)

    def fault_identity(self) -> dict[str, object]:
        """The session's lease row: ``{"sessions_table": name, "session_id": id}`` (tests only)."""
        return {"sessions_table": self._tables.sessions.name, "session_id": self._session_id}

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

    # Transactions and liveness

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
        ``OperationTimeoutError``.
        """
        deadline = deadline or time.monotonic() + self.settings.request_timeout
        while True:
            try:
                with calls_until(deadline, MIN_CONNECT_LEFT if retry else HEARTBEAT_CONNECT_LEFT):
                    conn = self._engine.connect()
            except sqlalchemy.exc.DBAPIError as exc:
                permanent = permanent_connect_failure(exc)
                if permanent is not None:
                    raise ConfigurationError(
                        f"cannot connect to {self.url.redacted()}: {permanent}"
                    ) from None
                if retry and time.monotonic() + RETRY_PAUSE < deadline:
                    time.sleep(RETRY_PAUSE)
                    continue
                raise BackendUnavailableError(
                    f"cannot reach {self.url.redacted()}: {describe_error(exc, self._engine)}"
                ) from None
            except sqlalchemy.exc.TimeoutError:
                raise OperationTimeoutError(
                    f"no free {self.name} connection in the pool within request_timeout"
                ) from None
            guard = self._watchdog.arm(conn.connection.dbapi_connection, deadline) if self._guarded else None
            committing = cut = False
            try:
                with conn:
                    try:
                        with conn.begin():
                            begin_sqlite(conn, write)
                            if write and retry and self._file.changed():
                                raise SessionLostError(f"{self._file.describe()}: this session is lost")
                            if fence is not None:
                                ephemeral.check_fence(conn, self._tables, fence)
                            result = work(conn)
                            if fence is not None and os.environ.pop(STOP_IN_FENCED_WRITE, None) is not None:
                                os.kill(os.getpid(), signal.SIGSTOP)
                            committing = True
                        return result
                    finally:  # before the connection goes back to the pool, where another call may take it
                        cut = guard is not None and self._watchdog.disarm(guard)
            except sqlalchemy.exc.IntegrityError:
                raise SessionLostError(
                    "this session's lease has expired; it is being re-established"
                ) from None
            except sqlalchemy.exc.DBAPIError as exc:
                stale = retry and exc.connection_invalidated and not committing and not cut
                if (stale or is_retryable(exc)) and time.monotonic() + RETRY_PAUSE < deadline:
                    time.sleep(RETRY_PAUSE)
                    continue
                reason = "no answer within request_timeout" if cut else describe_error(exc, self._engine)
                raise OperationTimeoutError(
                    f"{self.name} did not complete the call ({reason}); its effect is unknown"
                ) from None

    def _beat(self) -> None:
        """Renew the lease every ``session_timeout / 3``, and reap expired leases with it.

        Each renewal also learns when the earliest lease expires; if that is
        before the next heartbeat is due, the heartbeat comes ``REAP_SLACK``
        after that expiry instead, so a dead session is reaped as its lease
        expires. A live session renews every ``session_timeout / 3``, so its
        lease always expires later than the next heartbeat and causes none.

        An attempt is the retry: it fails at once when the database cannot be
        reached (SUSPENDED; tried again every ``TROUBLE_PAUSE``) and never runs
        past the moment the lease lapses, which is counted from the *start* of
        the last successful renewal (LOST). An attempt still running after
        ``session_timeout / 3`` (a server that stopped answering) is reported
        SUSPENDED while it goes on.
        """
        ttl = self.settings.session_timeout
        last_renewal = time.monotonic()
        pause = ttl / 3
        while not self._stop.wait(pause):
            started = time.monotonic()
            pause = TROUBLE_PAUSE
            if self._file.changed() and self._beat_state is not SessionState.LOST:
                log.warning("%s: the session is lost; it reopens on the new file", self._file.describe())
                self._report(SessionState.LOST)
                self._engine.dispose()  # pooled connections still write to the old file
                self._feed.rewind()
            if self._beat_state is not SessionState.LOST and started >= last_renewal + ttl:
                self._report(SessionState.LOST)  # the lease lapsed by our own clock
            try:
                if self._beat_state is SessionState.LOST:
                    self._replace_lease(started + self.settings.request_timeout)
                    next_expiry: float | None = math.inf
                else:
                    deadline = min(started + self.settings.request_timeout, last_renewal + ttl)
                    next_expiry = self._renew_watched(deadline, ttl / 3)
            except (OperationTimeoutError, BackendUnavailableError, SessionLostError) as exc:
                log.debug("heartbeat failed: %s", exc)
                lapsed = time.monotonic() - last_renewal > ttl
                lost = lapsed or self._beat_state is SessionState.LOST
                if lapsed and self._beat_state is not SessionState.LOST:
                    log.warning("the session is lost: no renewal for session_timeout; the last try: %s", exc)
                self._report(SessionState.LOST if lost else SessionState.SUSPENDED)
                continue
            if next_expiry is None:
                self._report(SessionState.LOST)
                try:
                    self._replace_lease(time.monotonic() + self.settings.request_timeout)
                except (OperationTimeoutError, BackendUnavailableError, SessionLostError) as exc:
                    log.debug("re-establishing the session failed: %s", exc)
                    continue
                next_expiry = math.inf
            last_renewal = started
            pause = min(ttl / 3, max(next_expiry, 0.0) + REAP_SLACK)
            self._report(SessionState.CONNECTED)

    def _renew_watched(self, deadline: float, slow: float) -> float | None:
        """One renewal (``_renew``); SUSPENDED is reported if it is still running after ``slow`` seconds."""
        running = threading.Event()
        running.set()

        def report_slow() -> None:
            with self._state_lock:
                if running.is_set() and self._beat_state is SessionState.CONNECTED:
                    self._beat_state = SessionState.SUSPENDED
                    self.events.state_changed(SessionState.SUSPENDED)

        timer = threading.Timer(slow, report_slow)
        timer.daemon = True
        timer.start()
        try:
            return self._run(self._renew, deadline=deadline, retry=False)
        finally:
            with self._state_lock:
                running.clear()
            timer.cancel()

    def _renew(self, conn: Connection) -> float | None:
        """Renew this session's lease and reap expired ones: seconds until the earliest lease left
        expires, or None if this session's lease had expired."""
        if not ephemeral.renew_lease(conn, self._tables, self._session_id, self.settings.session_timeout):
            return None
        ephemeral.reap_expired(conn, self._tables)
        prune(conn, self._tables)
        return ephemeral.next_expiry(conn, self._tables)

    def _replace_lease(self, deadline: float) -> None:
        """After a loss: drop what is left of the old lease and open a new one."""
        old, new = self._session_id, uuid.uuid4().hex

        def swap(conn: Connection) -> None:
            if not self._guarded:  # SQLite: a new database file has no tables
                self._tables.create(conn)
            ephemeral.drop_sessions(conn, self._tables, [old])
            ephemeral.open_lease(conn, self._tables, new, self.settings.session_timeout)

        self._run(swap, deadline=deadline, retry=False)
        self._session_id = new
        self._file.arm()

    def _report(self, state: SessionState) -> None:
        with self._state_lock:
            if state is self._beat_state:
                return
            self._beat_state = state
            self.events.state_changed(state)
