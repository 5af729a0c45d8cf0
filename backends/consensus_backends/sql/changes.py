"""The change log and the feeds that turn it into listener hints.

Every write appends ``(revision, kind, name)`` rows in its own transaction.
On PostgreSQL the same transaction sends ``pg_notify`` (delivered at commit)
and a LISTEN connection forwards them; on SQLite a poller reads rows past the
last revision it saw (SQLite commits one writer at a time, so revisions
commit in order). After a gap (a lost LISTEN connection, or rows pruned
before the poller read them) every watched target is re-read.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable

import sqlalchemy
from sqlalchemy import Connection, Engine, delete, func, insert, select

from consensus_api.backend import Target, TargetKind
from consensus_backends.sql.schema import Tables

log = logging.getLogger("consensus_api.sql")

KEEP_REVISIONS = 100_000
_SEPARATOR = "\t"


def channel(t: Tables) -> str:
    """The NOTIFY channel of these tables."""
    return t.changes.name


def log_changes(conn: Connection, t: Tables, targets: Iterable[Target]) -> None:
    """Record that ``targets`` changed, in ``conn``'s transaction."""
    for target in targets:
        revision = conn.execute(
            insert(t.changes).values(kind=target.kind.value, name=target.name).returning(t.changes.c.revision)
        ).scalar_one()
        if conn.dialect.name == "postgresql":
            payload = f"{revision}{_SEPARATOR}{target.kind.value}{_SEPARATOR}{target.name}"
            conn.execute(select(func.pg_notify(channel(t), payload)))


def prune(conn: Connection, t: Tables) -> None:
    """Drop change rows older than the last ``KEEP_REVISIONS``."""
    newest = conn.execute(select(func.max(t.changes.c.revision))).scalar()
    if newest is not None and newest > KEEP_REVISIONS:
        conn.execute(delete(t.changes).where(t.changes.c.revision <= newest - KEEP_REVISIONS))


Hint = Callable[[Target], None]
Resync = Callable[[], None]


class ChangeFeed:
    """A daemon thread that forwards change-log entries as hints."""

    def __init__(self, engine: Engine, t: Tables, hint: Hint, resync: Resync, poll_interval: float) -> None:
        self._engine = engine
        self._tables = t
        self._hint = hint
        self._resync = resync
        self._poll_interval = poll_interval
        self._stop = threading.Event()
        self._last = 0
        self._thread = threading.Thread(target=self._run, name="consensus-sql-changes", daemon=True)

    def start(self) -> None:
        """Begin forwarding changes committed from now on (from this call's start)."""
        with self._engine.connect() as conn:
            t = self._tables
            self._last = conn.execute(select(func.coalesce(func.max(t.changes.c.revision), 0))).scalar_one()
        self._thread.start()

    def stop(self, timeout: float) -> None:
        """End the thread; waits at most ``timeout``."""
        self._stop.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        if self._engine.dialect.name == "postgresql":
            self._listen()
        else:
            self._poll()

    def _forward(self, kind: str, name: str) -> None:
        self._hint(Target(TargetKind(kind), name))

    def _poll(self) -> None:
        t = self._tables
        last = self._last
        while not self._stop.wait(self._poll_interval):
            try:
                with self._engine.connect() as conn:
                    rows = conn.execute(
                        select(t.changes).where(t.changes.c.revision > last).order_by(t.changes.c.revision)
                    ).all()
            except sqlalchemy.exc.SQLAlchemyError as exc:
                log.debug("polling the change log failed: %s", exc)
                continue
            if rows and rows[0].revision != last + 1:
                self._resync()
            for row in rows:
                self._forward(row.kind, row.name)
            if rows:
                last = rows[-1].revision

    def _listen(self) -> None:
        import psycopg  # noqa: PLC0415  (PostgreSQL only; the extra may be absent for SQLite users)

        args, kwargs = self._engine.dialect.create_connect_args(self._engine.url)
        kwargs = {**kwargs, "autocommit": True}
        while not self._stop.is_set():
            try:
                with psycopg.connect(*args, **kwargs) as conn:
                    conn.execute(f'LISTEN "{channel(self._tables)}"')
                    self._resync()
                    while not self._stop.is_set():
                        for note in conn.notifies(timeout=0.25):
                            _, kind, name = note.payload.split(_SEPARATOR, 2)
                            self._forward(kind, name)
            except psycopg.Error as exc:
                log.debug("the LISTEN connection failed: %s", exc)
                self._stop.wait(0.25)
