"""SQLite's write lock under load: lease renewals first, and writes that never got it.

Every write transaction begins with ``BEGIN IMMEDIATE``, which waits for the
database's single write lock in SQLite's busy handler; that handler backs off
to 100 ms between tries, so under a steady stream of writers a waiter can
starve for its whole ``request_timeout``. Two rules keep sessions alive and
outcomes known:

* The heartbeat tries for the lock every ``EAGER_PAUSE`` until its deadline
  (``begin_eagerly``), far more often than application writers, and an
  application write that holds the lock anyway renews the session's lease in
  the same transaction when it is due (``lease.Lease.renew_in``), so a
  process that writes keeps its lease even while its heartbeat waits.
* A write whose ``BEGIN IMMEDIATE`` failed with ``SQLITE_BUSY`` (``is_busy``)
  wrote nothing: it is retried within its deadline, else reported with
  ``OperationTimeoutError(not_applied=True)``.
"""

from __future__ import annotations

import sqlite3
import time

import sqlalchemy
from sqlalchemy import Connection

#: Seconds between the heartbeat's tries for the write lock.
EAGER_PAUSE = 0.002


def is_busy(exc: sqlalchemy.exc.DBAPIError) -> bool:
    """SQLite reported the database locked (``SQLITE_BUSY``): the statement did not run."""
    return getattr(exc.orig, "sqlite_errorcode", None) == sqlite3.SQLITE_BUSY


def begin_eagerly(conn: Connection, deadline: float, busy_timeout: float) -> None:
    """``BEGIN IMMEDIATE``, tried every ``EAGER_PAUSE`` until ``deadline`` (then the busy error is
    raised); the connection's busy handler is off meanwhile and set back to ``busy_timeout`` after."""
    conn.exec_driver_sql("PRAGMA busy_timeout=0")
    try:
        while True:
            try:
                conn.exec_driver_sql("BEGIN IMMEDIATE")
                return
            except sqlalchemy.exc.OperationalError as exc:
                if not is_busy(exc) or time.monotonic() + EAGER_PAUSE >= deadline:
                    raise
            time.sleep(EAGER_PAUSE)
    finally:
        conn.exec_driver_sql(f"PRAGMA busy_timeout={round(busy_timeout * 1000)}")
