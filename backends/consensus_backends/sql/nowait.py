"""SQLite reads that never wait, for an event loop's thread (``Backend.nowait_reader``).

One connection of the session's pool is held for them, its busy handler off
(``PRAGMA busy_timeout=0``), and used by one caller at a time: a caller that
finds it in use, or a read that meets a lock (``SQLITE_BUSY``), gets
``WouldBlock`` at once, having done nothing. In WAL mode a reader takes no
lock a writer holds: it reads the last committed snapshot from the database
file and the WAL, both local files, so a read costs what the same read costs
on a worker thread (one ``BEGIN``, one ``SELECT``) and waits on nothing. It
never commits a write, so it never checkpoints. Any other error also gives
``WouldBlock`` and retires the connection: the ordinary call then reports it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TypeVar

import sqlalchemy
from sqlalchemy import Connection, Engine

from consensus_api.backend import WouldBlock
from consensus_api.model import Leadership, Versioned
from consensus_backends.sql import ephemeral, store
from consensus_backends.sql.engine import begin_sqlite
from consensus_backends.sql.schema import Tables
from consensus_backends.sql.writelock import is_busy

R = TypeVar("R")

log = logging.getLogger("consensus_api.sql")


class NowaitReader:
    """The four reads of ``consensus_api.backend.Reader`` on one held SQLite connection."""

    def __init__(self, tables: Tables) -> None:
        self._tables = tables
        self._lock = threading.Lock()
        self._conn: Connection | None = None

    def open(self, engine: Engine) -> None:
        """Hold a connection of ``engine`` (may wait: call it where waiting is allowed). If that
        fails, reads give ``WouldBlock`` (the ordinary calls then report what is wrong)."""
        try:
            conn = engine.connect()
            with conn.begin():
                conn.exec_driver_sql("PRAGMA busy_timeout=0")
        except sqlalchemy.exc.DBAPIError as exc:
            log.debug("no nowait connection: %s", type(exc).__name__)
            return
        with self._lock:
            self._conn = conn

    def is_open(self) -> bool:
        """Whether a connection is held (not before ``open``, after ``close`` or an error)."""
        return self._conn is not None

    def close(self) -> None:
        """Give the connection back to the pool (waits for a read in progress: at most one read)."""
        with self._lock:
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def fetch(self, key: str) -> Versioned | None:
        return self._read(lambda c: store.fetch(c, self._tables, key))

    def keys(self, namespace: str) -> frozenset[str]:
        return self._read(lambda c: store.keys(c, self._tables, namespace))

    def membership(self, group: str) -> dict[str, bytes]:
        return self._read(lambda c: ephemeral.membership(c, self._tables, group))

    def leadership(self, service: str) -> Leadership | None:
        return self._read(lambda c: ephemeral.leadership(c, self._tables, service))

    def _read(self, work: Callable[[Connection], R]) -> R:
        """``work`` in one read transaction on the held connection, or ``WouldBlock``."""
        if not self._lock.acquire(blocking=False):
            raise WouldBlock("the nowait connection is in use")
        try:
            conn = self._conn
            if conn is None:
                raise WouldBlock("no nowait connection")
            try:
                with conn.begin():
                    begin_sqlite(conn, write=False)
                    return work(conn)
            except sqlalchemy.exc.DBAPIError as exc:
                if not is_busy(exc):
                    log.debug("the nowait connection is retired after an error: %s", type(exc).__name__)
                    self._conn = None
                    conn.invalidate()
                    conn.close()
                raise WouldBlock("the read met a lock or an error; it did nothing") from None
        finally:
            self._lock.release()
