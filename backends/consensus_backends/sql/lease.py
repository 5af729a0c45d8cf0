"""The SQL backend's lease: a row per session, and the heartbeat thread that renews this session's.

A lease expires by the database clock ``session_timeout`` after its last
renewal; members and candidates reference their session's lease row and are
deleted with it (``drop_sessions``, which elects new leaders where needed). The
heartbeat renews this session's lease every ``session_timeout / 3`` and reaps
expired leases with it (see ``Lease._beat``); on SQLite an application write
renews it too when it is due, inside its own transaction, which holds the
write lock anyway (``writelock``), so a process whose writes get through keeps
its lease while its heartbeat waits for the lock.

The backend holds one ``Lease`` and talks to it through its public methods; the
lease reaches the backend only through what it was given: ``Transact`` (one
transaction of the heartbeat) and two calls for what a new database file or a
new lease asks of the backend's other parts.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Protocol, TypeVar

from sqlalchemy import Connection, delete, func, literal, select

from consensus_api.backend import BackendEvents, Target, TargetKind, lapses_at, retry_pause
from consensus_api.config import Options
from consensus_api.errors import BackendUnavailableError, OperationTimeoutError, SessionLostError
from consensus_api.model import SessionState
from consensus_backends.sql import election
from consensus_backends.sql.changes import log_changes, prune
from consensus_backends.sql.dialect import db_now, delete_returning, update_returning
from consensus_backends.sql.filecheck import FileIdentity
from consensus_backends.sql.layout import Tables

log = logging.getLogger("consensus_api.sql")

R = TypeVar("R")
#: Seconds between heartbeats while the database is unreachable.
TROUBLE_PAUSE = 0.25
#: A heartbeat due to reap a lease comes this many seconds after the lease expires (database
#: clock); it is also the shortest pause between heartbeats, so they never spin.
REAP_SLACK = 0.01


def open_lease(conn: Connection, t: Tables, session_id: str, ttl: float) -> None:
    """Create a lease that expires ``ttl`` seconds from now by the database clock."""
    now = db_now(conn.dialect.name)
    conn.execute(
        t.sessions.insert().from_select(["id", "expires_at"], select(literal(session_id), now + ttl))
    )


def renew_lease(conn: Connection, t: Tables, session_id: str, ttl: float) -> bool:
    """Extend an unexpired lease; False if it has expired or was reaped."""
    now = db_now(conn.dialect.name)
    s = t.sessions.c
    renewed = update_returning(
        conn,
        t.sessions,
        s.id == session_id,
        s.expires_at >= now,
        values={"expires_at": now + ttl},
        returning=s.id,
    )
    return renewed is not None


def next_expiry(conn: Connection, t: Tables) -> float:
    """Seconds from now until the earliest lease expires, by the database clock (``inf`` without leases)."""
    left = conn.execute(select(func.min(t.sessions.c.expires_at) - db_now(conn.dialect.name))).scalar()
    return math.inf if left is None else float(left)


def reap_expired(conn: Connection, t: Tables) -> None:
    """Drop every expired lease with its members and candidates."""
    expired = (
        conn.execute(select(t.sessions.c.id).where(t.sessions.c.expires_at < db_now(conn.dialect.name)))
        .scalars()
        .all()
    )
    if expired:
        drop_sessions(conn, t, expired)


def drop_sessions(conn: Connection, t: Tables, session_ids: Iterable[str]) -> None:
    """Delete leases with their members and candidates; elect new leaders where needed."""
    ids = list(session_ids)
    services = sorted(
        conn.execute(select(t.candidates.c.service).where(t.candidates.c.session_id.in_(ids)).distinct())
        .scalars()
        .all()
    )
    for service in services:
        election.lock_service(conn, t, service)
    groups = delete_returning(conn, t.members, t.members.c.session_id.in_(ids), t.members.c.grp)
    conn.execute(delete(t.candidates).where(t.candidates.c.session_id.in_(ids)))
    conn.execute(delete(t.sessions).where(t.sessions.c.id.in_(ids)))
    log_changes(conn, t, [Target(TargetKind.GROUP, g) for g in sorted(set(groups))])
    for service in services:
        election.elect(conn, t, service)


class Transact(Protocol):
    """How the lease runs one transaction of its heartbeat: ``work`` in a transaction that ends by
    ``deadline``, tried once (the heartbeat is a retry loop itself); the backend's transaction runner."""

    def __call__(self, work: Callable[[Connection], R], deadline: float) -> R: ...


class Lease:
    """This session's lease row and the heartbeat thread that keeps it (see the module docstring).

    ``database_file``: SQLite's file, which application writes renew the lease in
    and which is checked for replacement; None for a database server.
    ``file_replaced()``: the file was deleted or replaced (the session is LOST):
    drop what holds the old one. ``reopened()``: a new lease row was opened after
    a loss.
    """

    def __init__(
        self,
        tables: Tables,
        settings: Options,
        events: BackendEvents,
        *,
        database_file: str | None,
        transact: Transact,
        file_replaced: Callable[[], None],
        reopened: Callable[[], None],
    ) -> None:
        self._tables = tables
        self._settings = settings
        self._events = events
        self._sqlite = database_file is not None
        self._file = FileIdentity(database_file)
        self._transact = transact
        self._file_replaced = file_replaced
        self._reopened = reopened
        #: The id of this session's lease row (a new one after a loss).
        self.session_id = uuid.uuid4().hex
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="consensus-sql-heartbeat", daemon=True)
        self._state_lock = threading.Lock()
        self._state = SessionState.CONNECTED
        #: When the last renewal that committed began (monotonic): by the heartbeat or a write.
        self._renewed_at = time.monotonic()

    def create(self, conn: Connection) -> None:
        """Insert this session's lease row, in ``conn``'s transaction."""
        open_lease(conn, self._tables, self.session_id, self._settings.session_timeout)

    def opened(self) -> None:
        """The row ``create`` inserted has just committed: the file now at the path is this
        session's, and the lease was renewed now."""
        self._file.arm()
        self._renewed_at = time.monotonic()

    def start(self) -> None:
        """Start the heartbeat."""
        self._thread.start()

    def stop(self, timeout: float) -> None:
        """End the heartbeat; waits at most ``timeout``."""
        self._stop.set()
        self._thread.join(timeout)

    def _beat(self) -> None:
        """Renew the lease every ``session_timeout / 3``, and reap expired leases with it.

        Each renewal also learns when the earliest lease expires; if that is
        before the next heartbeat is due, the heartbeat comes ``REAP_SLACK``
        after that expiry instead, so a dead session is reaped as its lease
        expires. A live session renews every ``session_timeout / 3``, so its
        lease always expires later than the next heartbeat and causes none.

        An attempt is the retry: it fails at once when the database cannot be
        reached (SUSPENDED; tried again every ``TROUBLE_PAUSE``, and at the
        moment the lease lapses) and never runs past that moment (LOST), which
        is ``_lapses_at``: before any other session can reap the lease. An attempt still running after
        ``session_timeout / 3`` (a server that stopped answering) is reported
        SUSPENDED while it goes on. On SQLite an application write renews the
        lease too (``renew_in``): neither SUSPENDED nor LOST is reported while
        such renewals keep the lease ``_fresh``.
        """
        ttl = self._settings.session_timeout
        pause = ttl / 3
        while not self._stop.wait(pause):
            started = time.monotonic()
            pause = TROUBLE_PAUSE
            if self._file.changed() and self._state is not SessionState.LOST:
                log.warning("%s: the session is lost; it reopens on the new file", self._file.describe())
                self._report(SessionState.LOST)
                self._file_replaced()
            if self._state is not SessionState.LOST and started >= self._lapses_at():
                self._report(SessionState.LOST)  # the lease lapsed by our own clock
            try:
                if self._state is SessionState.LOST:
                    self._replace_lease(started + self._settings.request_timeout)
                    next_expiry: float | None = math.inf
                else:
                    deadline = min(started + self._settings.request_timeout, self._lapses_at())
                    next_expiry = self._renew_watched(deadline, ttl / 3)
            except (OperationTimeoutError, BackendUnavailableError, SessionLostError) as exc:
                log.debug("heartbeat failed: %s", exc)
                lapsed = time.monotonic() >= self._lapses_at()
                lost = lapsed or self._state is SessionState.LOST
                if lapsed and self._state is not SessionState.LOST:
                    log.warning("the session is lost: no renewal for session_timeout; the last try: %s", exc)
                if lost or not self._fresh():
                    self._report(SessionState.LOST if lost else SessionState.SUSPENDED)
                if not lost:
                    pause = retry_pause(TROUBLE_PAUSE, self._lapses_at(), REAP_SLACK)
                continue
            if next_expiry is None:
                self._report(SessionState.LOST)
                try:
                    self._replace_lease(time.monotonic() + self._settings.request_timeout)
                except (OperationTimeoutError, BackendUnavailableError, SessionLostError) as exc:
                    log.debug("re-establishing the session failed: %s", exc)
                    continue
                next_expiry = math.inf
            self.renewed(started)
            pause = min(ttl / 3, max(next_expiry, 0.0) + REAP_SLACK)
            self._report(SessionState.CONNECTED)

    def _renew_watched(self, deadline: float, slow: float) -> float | None:
        """One renewal (``_renew``); SUSPENDED is reported if it is still running after ``slow`` seconds
        and the lease is not ``_fresh`` (else once it stops being fresh, if it is still running)."""
        running = threading.Event()
        running.set()
        timers: list[threading.Timer] = []

        def report_slow() -> None:
            with self._state_lock:
                if not running.is_set() or self._state is not SessionState.CONNECTED:
                    return
                left = self._fresh_left()
                if left <= 0:
                    self._state = SessionState.SUSPENDED
                    self._events.state_changed(SessionState.SUSPENDED)
                    return
                arm(left)  # a write renewed the lease meanwhile: look again when it is no longer fresh

        def arm(delay: float) -> None:
            timer = threading.Timer(delay, report_slow)
            timer.daemon = True
            timers.append(timer)
            timer.start()

        arm(slow)
        try:
            return self._transact(self._renew, deadline)
        finally:
            with self._state_lock:
                running.clear()
                for timer in timers:
                    timer.cancel()

    def renew_in(self, conn: Connection) -> float | None:
        """SQLite, in an application write's transaction (which holds the write lock): refuse it if
        the database file changed (``SessionLostError``), else renew the lease if a sixth of it has
        passed; when this renewal began, or None. It counts once the transaction commits
        (``renewed``)."""
        if not self._sqlite or not self._file.armed:  # before the lease row was opened: none to renew
            return None
        if self._file.changed():
            raise SessionLostError(f"{self._file.describe()}: this session is lost")
        if self._state is SessionState.LOST:
            return None
        began = time.monotonic()
        if began - self._renewed_at < self._settings.session_timeout / 6:
            return None
        renewed = renew_lease(conn, self._tables, self.session_id, self._settings.session_timeout)
        return began if renewed else None

    def renewed(self, began: float) -> None:
        """A renewal that began at ``began`` committed."""
        with self._state_lock:
            self._renewed_at = max(self._renewed_at, began)

    def _lapses_at(self) -> float:
        """When this session presumes its lease lapsed (``backend.lapses_at``): LOST is reported, and
        what it held given up, before another session's heartbeat can reap the lease."""
        return lapses_at(self._renewed_at, self._settings.session_timeout)

    def _fresh(self) -> bool:
        """SQLite: a renewal committed within the last heartbeat period (``session_timeout / 3``),
        so a heartbeat's trouble is no news; never elsewhere (only heartbeats renew there)."""
        return self._fresh_left() > 0

    def _fresh_left(self) -> float:
        """Seconds until the lease stops being ``_fresh`` (0 or less: it is not)."""
        if not self._sqlite:
            return 0.0
        return self._renewed_at + self._settings.session_timeout / 3 - time.monotonic()

    def _renew(self, conn: Connection) -> float | None:
        """Renew this session's lease and reap expired ones: seconds until the earliest lease left
        expires, or None if this session's lease had expired."""
        if not renew_lease(conn, self._tables, self.session_id, self._settings.session_timeout):
            return None
        reap_expired(conn, self._tables)
        prune(conn, self._tables)
        return next_expiry(conn, self._tables)

    def _replace_lease(self, deadline: float) -> None:
        """After a loss: drop what is left of the old lease and open a new one."""
        old, new = self.session_id, uuid.uuid4().hex

        def swap(conn: Connection) -> None:
            if self._sqlite:  # a new database file has no tables
                self._tables.create(conn)
            drop_sessions(conn, self._tables, [old])
            open_lease(conn, self._tables, new, self._settings.session_timeout)

        self._transact(swap, deadline)
        self.session_id = new
        self._file.arm()
        self._reopened()

    def _report(self, state: SessionState) -> None:
        with self._state_lock:
            if state is self._state:
                return
            self._state = state
            self._events.state_changed(state)
