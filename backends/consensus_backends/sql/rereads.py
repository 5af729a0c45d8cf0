"""PostgreSQL's re-reads after a change notification (``Backend.change_reader``), on one
connection of their own.

After a NOTIFY the core re-reads the changed target. Here that read is the
backend's own statement (``statements``, compiled once) sent by psycopg on one
connection held outside the pool (``engine.own_connection``: opened like the
pool's), in autocommit and prepared on the server: no pool checkout, no
``BEGIN``/``COMMIT``, no SQLAlchemy execution. A read right after a change is
a read of cold code and caches: from the notification to the listener, the
re-read of a group took 0.67 to 0.74 ms through the pool (also on a connection
held from it), 0.46 ms this way (PostgreSQL 15, two shared cores, p50 of 300
joins). Each session holds one more server connection for it, from its first re-read.

Each read is one statement at READ COMMITTED on the one server: it sees every
commit that preceded it, the notified one included, and never less than an
earlier read of this session. Reads are serialized on the connection (they come
from the dispatcher thread). One that outlives ``request_timeout`` has its
socket cut (``Watchdog``). A held connection that fails (the server restarted
since its last read) is replaced at once and the read sent again on the new
one; a read that fails on a fresh connection, or outlives its time, closes it
and raises ``BackendUnavailableError``: the core reads again shortly.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import sqlalchemy
from sqlalchemy import Engine

from consensus_api.errors import BackendUnavailableError
from consensus_api.model import Leadership, Versioned
from consensus_backends.sql import election, membership, statements, storage
from consensus_backends.sql.client import own_connection
from consensus_backends.sql.errors import describe_error
from consensus_backends.sql.layout import Tables
from consensus_backends.sql.watchdog import Watchdog

#: The reads of ``consensus_api.backend.Reader``, by their statement's name in ``statements``.
READS = ("fetch", "keys", "membership", "leadership")


class ChangeReader:
    """The reads of ``consensus_api.backend.Reader`` on one connection of its own (PostgreSQL)."""

    def __init__(self, engine: Engine, tables: Tables, watchdog: Watchdog, timeout: float) -> None:
        prepared = statements.for_dialect(tables, engine.dialect.name)
        self._sql = {read: str(getattr(prepared, read).compile(dialect=engine.dialect)) for read in READS}
        self._engine = engine
        self._watchdog = watchdog
        self._timeout = timeout
        self._lock = threading.Lock()
        self._conn: Any = None

    def fetch(self, key: str) -> Versioned | None:
        return storage.versioned(self._first("fetch", {"b_key": key}))

    def keys(self, namespace: str) -> frozenset[str]:
        return storage.key_set(self._rows("keys", {"b_parent": namespace}))

    def membership(self, group: str) -> dict[str, bytes]:
        return membership.members(self._rows("membership", {"b_group": group}))

    def leadership(self, service: str) -> Leadership | None:
        return election.leader(service, self._first("leadership", {"b_service": service}))

    def close(self) -> None:
        """Close the connection (waits for a read in progress: at most ``request_timeout``)."""
        with self._lock:
            self._close()

    def _first(self, read: str, params: dict[str, str]) -> Any:
        rows = self._rows(read, params)
        return rows[0] if rows else None

    def _rows(self, read: str, params: dict[str, str]) -> list[Any]:
        """The statement's rows; a held connection that fails (a server restart since its last
        read) is replaced and the read sent once more: it is a read, and the new connection is fresh."""
        import psycopg  # noqa: PLC0415 - the postgresql extra, absent for other schemes

        deadline = time.monotonic() + self._timeout
        with self._lock:
            while True:
                fresh, cut = self._conn is None, False
                try:
                    conn = self._held(deadline)
                    token = self._watchdog.arm(conn, deadline)
                    try:
                        rows: list[Any] = conn.execute(self._sql[read], params, prepare=True).fetchall()
                    finally:
                        cut = self._watchdog.disarm(token)
                except sqlalchemy.exc.TimeoutError:
                    raise BackendUnavailableError("no free connection in the pool for a re-read") from None
                except (psycopg.Error, sqlalchemy.exc.DBAPIError) as exc:
                    self._close()
                    if not fresh and not cut:
                        continue
                    reason = "no answer within request_timeout" if cut else describe_error(exc, self._engine)
                    raise BackendUnavailableError(f"re-reading a changed target failed ({reason})") from None
                if cut:  # answered as its socket was cut: the next read needs a new connection
                    self._close()
                return rows

    def _held(self, deadline: float) -> Any:
        if self._conn is None:
            from psycopg.rows import namedtuple_row  # noqa: PLC0415 - the postgresql extra, absent for other schemes

            self._conn = own_connection(self._engine, deadline)
            self._conn.row_factory = namedtuple_row
        return self._conn

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
