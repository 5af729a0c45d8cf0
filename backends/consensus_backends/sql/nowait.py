"""SQLite calls that never wait, for an event loop's thread (``Backend.nowait_reader`` and
``nowait_writer``).

One connection of the session's pool is held for them, its busy handler off
(``PRAGMA busy_timeout=0``) and its automatic checkpoints off
(``PRAGMA wal_autocheckpoint=0``: the session's other connections checkpoint),
and used by one caller at a time: a caller that finds it in use gets
``WouldBlock`` at once, having done nothing.

* A read takes no lock a writer holds (WAL mode): it reads the last committed
  snapshot from the database file and the WAL, both local files, and costs what
  the same read costs on a worker thread (one ``BEGIN``, one ``SELECT``).
* A write begins with ``BEGIN IMMEDIATE``, which either takes the database's one
  write lock at once or fails with ``SQLITE_BUSY`` (another writer holds it):
  ``WouldBlock``, nothing written. Holding the lock, its statements wait on
  nobody, and its commit appends to the WAL without a checkpoint or an fsync
  (``synchronous=NORMAL``). It checks the database file and renews the lease
  like every write of the session (``renew_in`` / ``renewed``).

Any other error before a commit also gives ``WouldBlock`` (the transaction
rolled back: nothing was done) and retires the connection: the ordinary call
then reports it. An error of the commit itself leaves the write's effect
unknown: ``OperationTimeoutError``, as the ordinary write reports it. A lost
lease (``IntegrityError``) is ``SessionLostError`` there too.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import sqlalchemy
from sqlalchemy import Connection, Engine

from consensus_api.backend import WouldBlock
from consensus_api.errors import OperationTimeoutError, SessionLostError
from consensus_api.model import Leadership, Versioned
from consensus_backends.sql import election, membership, storage
from consensus_backends.sql.client import begin_sqlite
from consensus_backends.sql.layout import Tables
from consensus_backends.sql.writelock import is_busy

R = TypeVar("R")

log = logging.getLogger("consensus_api.sql")


class NowaitStore:
    """The reads of ``consensus_api.backend.Reader`` and the writes of ``Writer`` on one held SQLite
    connection. ``renew_in(conn)`` runs first in every write (it may refuse it with
    ``SessionLostError``) and returns a renewal to confirm with ``renewed`` after the commit."""

    def __init__(
        self,
        tables: Tables,
        renew_in: Callable[[Connection], float | None],
        renewed: Callable[[float], None],
    ) -> None:
        self._tables = tables
        self._renew_in = renew_in
        self._renewed = renewed
        self._lock = threading.Lock()
        self._conn: Connection | None = None

    def open(self, engine: Engine) -> None:
        """Hold a connection of ``engine`` (may wait: call it where waiting is allowed). If that
        fails, calls give ``WouldBlock`` (the ordinary calls then report what is wrong)."""
        try:
            conn = engine.connect()
            with conn.begin():
                conn.exec_driver_sql("PRAGMA busy_timeout=0")
                conn.exec_driver_sql("PRAGMA wal_autocheckpoint=0")
        except sqlalchemy.exc.DBAPIError as exc:
            log.debug("no nowait connection: %s", type(exc).__name__)
            return
        with self._lock:
            self._conn = conn

    def is_open(self) -> bool:
        """Whether a connection is held (not before ``open``, after ``close`` or an error)."""
        return self._conn is not None

    def close(self) -> None:
        """Give the connection back to the pool (waits for a call in progress: at most one call)."""
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def fetch(self, key: str) -> Versioned | None:
        return self._read(lambda c: storage.fetch(c, self._tables, key))

    def keys(self, namespace: str) -> frozenset[str]:
        return self._read(lambda c: storage.keys(c, self._tables, namespace))

    def membership(self, group: str) -> dict[str, bytes]:
        return self._read(lambda c: membership.membership(c, self._tables, group))

    def leadership(self, service: str) -> Leadership | None:
        return self._read(lambda c: election.leadership(c, self._tables, service))

    def put(self, key: str, value: bytes, fence: Leadership | None) -> int:
        return self._write(lambda c: storage.put(c, self._tables, key, value), fence)

    def update(self, key: str, value: bytes, version: int | None, fence: Leadership | None) -> int:
        return self._write(lambda c: storage.update_value(c, self._tables, key, value, version), fence)

    def delete(self, key: str, version: int | None, fence: Leadership | None) -> None:
        self._write(lambda c: storage.delete(c, self._tables, key, version), fence)

    def _read(self, work: Callable[[Connection], R]) -> R:
        """``work`` in one read transaction on the held connection, or ``WouldBlock``."""
        with self._held() as conn, conn.begin():
            begin_sqlite(conn, write=False)
            return work(conn)

    def _write(self, work: Callable[[Connection], R], fence: Leadership | None) -> R:
        """``work`` in one write transaction (after the ``fence`` check) on the held connection if
        the write lock is free at once, else ``WouldBlock``."""
        with self._held() as conn:
            transaction = conn.begin()
            try:
                begin_sqlite(conn, write=True)
                renewing = self._renew_in(conn)
                if fence is not None:
                    election.check_fence(conn, self._tables, fence)
                result = work(conn)
            except BaseException:
                transaction.rollback()
                raise
            try:
                transaction.commit()
            except sqlalchemy.exc.DBAPIError as exc:
                self._retire(conn, exc)
                raise OperationTimeoutError(
                    f"sqlite did not complete the call ({type(exc).__name__}); its effect is unknown"
                ) from None
        if renewing is not None:
            self._renewed(renewing)
        return result

    @contextmanager
    def _held(self) -> Iterator[Connection]:
        """The held connection for one transaction; ``WouldBlock`` if it is in use or absent, or if
        the transaction failed before its commit (retiring the connection unless it met a lock)."""
        if not self._lock.acquire(blocking=False):
            raise WouldBlock("the nowait connection is in use")
        try:
            conn = self._conn
            if conn is None:
                raise WouldBlock("no nowait connection")
            try:
                yield conn
            except sqlalchemy.exc.IntegrityError:
                raise SessionLostError(
                    "this session's lease has expired; it is being re-established"
                ) from None
            except sqlalchemy.exc.DBAPIError as exc:
                if not is_busy(exc):
                    self._retire(conn, exc)
                raise WouldBlock("the call met a lock or an error; it did nothing") from None
        finally:
            self._lock.release()

    def _retire(self, conn: Connection, error: BaseException) -> None:
        """Stop using ``conn`` after ``error`` (the lock is held): calls give ``WouldBlock`` from now."""
        log.debug("the nowait connection is retired after an error: %s", type(error).__name__)
        self._conn = None
        conn.invalidate()
        conn.close()
