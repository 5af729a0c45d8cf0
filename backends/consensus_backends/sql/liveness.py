"""The SQL backend's lease: the heartbeat thread and the renewals that keep a session alive.

The lease expires by the database clock ``session_timeout`` after its last
renewal. The heartbeat renews it every ``session_timeout / 3`` and reaps
expired leases with it (see ``Liveness._beat``); on SQLite an application
write renews it too when it is due, inside its own transaction, which holds
the write lock anyway (``writelock``), so a process whose writes get through
keeps its lease while its heartbeat waits for the lock.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from abc import abstractmethod
from collections.abc import Callable
from typing import TypeVar

from sqlalchemy import Connection, Engine

from consensus_api.backend import BackendEvents, lapses_at, retry_pause
from consensus_api.config import Options
from consensus_api.errors import BackendUnavailableError, OperationTimeoutError, SessionLostError
from consensus_api.model import Leadership, SessionState
from consensus_backends.sql import ephemeral
from consensus_backends.sql.changes import ChangeFeed, prune
from consensus_backends.sql.filecheck import FileIdentity
from consensus_backends.sql.nowait import NowaitStore
from consensus_backends.sql.schema import Tables

log = logging.getLogger("consensus_api.sql")

R = TypeVar("R")
#: Seconds between heartbeats while the database is unreachable.
TROUBLE_PAUSE = 0.25
#: A heartbeat due to reap a lease comes this many seconds after the lease expires (database
#: clock); it is also the shortest pause between heartbeats, so they never spin.
REAP_SLACK = 0.01


class Liveness:
    """The lease half of ``SQLBackend`` (a mixin): it supplies ``_run`` and the attributes below."""

    settings: Options
    events: BackendEvents
    _engine: Engine
    _tables: Tables
    _session_id: str
    _file: FileIdentity
    _nowait: NowaitStore | None
    _feed: ChangeFeed
    _guarded: bool
    _stop: threading.Event
    _state_lock: threading.Lock
    _beat_state: SessionState
    #: When the last renewal that committed began (monotonic): by the heartbeat or a write.
    _renewed_at: float

    @abstractmethod
    def _run(
        self,
        work: Callable[[Connection], R],
        *,
        write: bool = True,
        fence: Leadership | None = None,
        deadline: float | None = None,
        retry: bool = True,
    ) -> R:
        """One transaction (``SQLBackend._run``)."""

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
        lease too (``_renew_in``): neither SUSPENDED nor LOST is reported while
        such renewals keep the lease ``_fresh``.
        """
        ttl = self.settings.session_timeout
        pause = ttl / 3
        while not self._stop.wait(pause):
            started = time.monotonic()
            pause = TROUBLE_PAUSE
            if self._file.changed() and self._beat_state is not SessionState.LOST:
                log.warning("%s: the session is lost; it reopens on the new file", self._file.describe())
                self._report(SessionState.LOST)
                self._engine.dispose()  # pooled connections still write to the old file
                if self._nowait is not None:
                    self._nowait.close()  # held, so not disposed: inline reads go to workers meanwhile
                self._feed.rewind()
            if self._beat_state is not SessionState.LOST and started >= self._lapses_at():
                self._report(SessionState.LOST)  # the lease lapsed by our own clock
            try:
                if self._beat_state is SessionState.LOST:
                    self._replace_lease(started + self.settings.request_timeout)
                    next_expiry: float | None = math.inf
                else:
                    deadline = min(started + self.settings.request_timeout, self._lapses_at())
                    next_expiry = self._renew_watched(deadline, ttl / 3)
            except (OperationTimeoutError, BackendUnavailableError, SessionLostError) as exc:
                log.debug("heartbeat failed: %s", exc)
                lapsed = time.monotonic() >= self._lapses_at()
                lost = lapsed or self._beat_state is SessionState.LOST
                if lapsed and self._beat_state is not SessionState.LOST:
                    log.warning("the session is lost: no renewal for session_timeout; the last try: %s", exc)
                if lost or not self._fresh():
                    self._report(SessionState.LOST if lost else SessionState.SUSPENDED)
                if not lost:
                    pause = retry_pause(TROUBLE_PAUSE, self._lapses_at(), REAP_SLACK)
                continue
            if next_expiry is None:
                self._report(SessionState.LOST)
                try:
                    self._replace_lease(time.monotonic() + self.settings.request_timeout)
                except (OperationTimeoutError, BackendUnavailableError, SessionLostError) as exc:
                    log.debug("re-establishing the session failed: %s", exc)
                    continue
                next_expiry = math.inf
            self._renewed(started)
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
                if not running.is_set() or self._beat_state is not SessionState.CONNECTED:
                    return
                left = self._fresh_left()
                if left <= 0:
                    self._beat_state = SessionState.SUSPENDED
                    self.events.state_changed(SessionState.SUSPENDED)
                    return
                arm(left)  # a write renewed the lease meanwhile: look again when it is no longer fresh

        def arm(delay: float) -> None:
            timer = threading.Timer(delay, report_slow)
            timer.daemon = True
            timers.append(timer)
            timer.start()

        arm(slow)
        try:
            return self._run(self._renew, deadline=deadline, retry=False)
        finally:
            with self._state_lock:
                running.clear()
                for timer in timers:
                    timer.cancel()

    def _renew_in(self, conn: Connection) -> float | None:
        """SQLite, in an application write's transaction (which holds the write lock): refuse it if
        the database file changed (``SessionLostError``), else renew the lease if a sixth of it has
        passed; when this renewal began, or None. It counts once the transaction commits
        (``_renewed``)."""
        if self._guarded or not self._file.armed:  # before open() has opened the lease: none to renew
            return None
        if self._file.changed():
            raise SessionLostError(f"{self._file.describe()}: this session is lost")
        if self._beat_state is SessionState.LOST:
            return None
        began = time.monotonic()
        if began - self._renewed_at < self.settings.session_timeout / 6:
            return None
        renewed = ephemeral.renew_lease(conn, self._tables, self._session_id, self.settings.session_timeout)
        return began if renewed else None

    def _lapses_at(self) -> float:
        """When this session presumes its lease lapsed (``backend.lapses_at``): LOST is reported, and
        what it held given up, before another session's heartbeat can reap the lease."""
        return lapses_at(self._renewed_at, self.settings.session_timeout)

    def _renewed(self, began: float) -> None:
        """A renewal that began at ``began`` committed."""
        with self._state_lock:
            self._renewed_at = max(self._renewed_at, began)

    def _fresh(self) -> bool:
        """SQLite: a renewal committed within the last heartbeat period (``session_timeout / 3``),
        so a heartbeat's trouble is no news; never elsewhere (only heartbeats renew there)."""
        return self._fresh_left() > 0

    def _fresh_left(self) -> float:
        """Seconds until the lease stops being ``_fresh`` (0 or less: it is not)."""
        if self._guarded:
            return 0.0
        return self._renewed_at + self.settings.session_timeout / 3 - time.monotonic()

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
        if self._nowait is not None and not self._nowait.is_open():
            self._nowait.open(self._engine)

    def _report(self, state: SessionState) -> None:
        with self._state_lock:
            if state is self._beat_state:
                return
            self._beat_state = state
            self.events.state_changed(state)
