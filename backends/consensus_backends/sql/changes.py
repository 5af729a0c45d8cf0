"""The change log and the feeds that turn it into listener hints.

Every write appends ``(revision, kind, name)`` rows in its own transaction.
On PostgreSQL the same transaction sends ``pg_notify`` (delivered at commit)
and a LISTEN connection forwards them; on SQLite and MySQL/MariaDB a poller
reads rows past the last revision it saw. On SQLite the poller first asks
a connection of its own for ``PRAGMA data_version``, which changes whenever
another connection committed, and reads the log only then, on that connection,
with one prepared statement. On Linux it sleeps until a process writes the
database's files (``filewatch.FileWatch``, inotify) or ``SAFETY_POLL`` passes;
elsewhere it polls every ``poll_interval`` (10 ms by default). Either way it
looks again soon after a change, when a reply to it may follow (``Pace``).
SQLite commits one writer at a time, so revisions commit in order.
InnoDB does not: a revision may commit after a later one, or never (its transaction rolled back), so a missing
revision (a hole) holds the poller's position (``Holes``) while the rows
after it are forwarded, until a share-lock read of it tells: a row (it
committed: forwarded), no row (it never will), or a lock held (its
transaction is still open: asked again at the next poll). Only the last
``START_WINDOW`` revisions are asked about: a transaction still open when a
thousand later revisions have committed is not waited for. After a gap (a
lost LISTEN connection, rows pruned before the poller read them, holes
settled unasked) every watched target is re-read.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

import sqlalchemy
from sqlalchemy import Connection, Engine, bindparam, delete, func, select

from consensus_api.backend import Target, TargetKind
from consensus_backends.sql import statements
from consensus_backends.sql.client import own_connection
from consensus_backends.sql.dialect import MYSQL_DIALECTS
from consensus_backends.sql.errors import describe_error
from consensus_backends.sql.filewatch import FileWatch
from consensus_backends.sql.layout import Tables
from consensus_backends.sql.watchdog import cut

log = logging.getLogger("consensus_api.sql")

KEEP_REVISIONS = 100_000
#: Seconds a hole stays unasked: InnoDB takes a revision and inserts its row within one statement,
#: so a hole this old is a transaction still open, rolled back, or committed since.
HOLE_SETTLE = 0.2
#: Revisions below the newest that MySQL's feed checks for holes (transactions in flight); older
#: ones are settled unasked, with a re-read of every watched target.
START_WINDOW = 1000
#: SQLite's pace after a change (``Pace``).
AFTER_CHANGE_POLL = 0.001
IDLE_GROWTH = 2
#: SQLite with a file watch: polls at ``AFTER_CHANGE_POLL`` after a write to the database's files
#: whose commit was not visible yet (a WAL commit writes its frames, then publishes them in the
#: ``-shm`` map, which raises no file event), before the pace slows down again.
CHASE_POLLS = 8
#: SQLite with a file watch: the longest sleep without a file event (a missed or unraised event,
#: such as another host's write on a network file system, is seen this late at most).
SAFETY_POLL = 1.0
#: PostgreSQL: the longest wait for a notification before the LISTEN loop looks at ``stop`` again
#: (``stop`` cuts the connection, which ends the wait at once).
LISTEN_WAIT = 5.0


def channel(t: Tables) -> str:
    """The NOTIFY channel of these tables."""
    return t.changes.name


def log_changes(conn: Connection, t: Tables, targets: Iterable[Target]) -> None:
    """Record that ``targets`` changed, in ``conn``'s transaction."""
    log = statements.of(conn, t).log
    for target in targets:
        conn.execute(log, {"b_kind": target.kind.value, "b_name": target.name})


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
        self._holes: Holes | None = None  # MySQL/MariaDB only
        self._rewound = threading.Event()
        self._watch: FileWatch | None = None  # SQLite on Linux
        self._listening: Any = None  # PostgreSQL: the LISTEN connection
        self._thread = threading.Thread(target=self._run, name="consensus-sql-changes", daemon=True)

    def start(self) -> None:
        """Begin forwarding changes committed from now on (from this call's start)."""
        with self._engine.connect() as conn:
            revision = self._tables.changes.c.revision
            self._last = conn.execute(select(func.coalesce(func.max(revision), 0))).scalar_one()
            if self._engine.dialect.name in MYSQL_DIALECTS:
                committed = conn.execute(select(revision).where(revision > self._last - START_WINDOW))
                self._holes = Holes(self._last, committed.scalars())
        database = self._engine.url.database
        if self._engine.dialect.name == "sqlite" and database and database != ":memory:":
            self._watch = FileWatch.open(database)
        self._thread.start()

    def rewind(self) -> None:
        """Read the log from its start again, and re-read every watched target: the SQLite database
        file was replaced, so its log starts over (SQLite only)."""
        self._rewound.set()

    def stop(self, timeout: float) -> None:
        """End the thread; waits at most ``timeout``."""
        self._stop.set()
        if self._watch is not None:
            self._watch.interrupt()
        if self._listening is not None:
            cut(self._listening)  # ends its wait for a notification
        self._thread.join(timeout)
        if self._watch is not None and not self._thread.is_alive():
            self._watch.close()

    def _run(self) -> None:
        if self._engine.dialect.name == "postgresql":
            self._listen()
        else:
            self._poll()

    def _forward(self, kind: str, name: str) -> None:
        self._hint(Target(TargetKind(kind), name))

    def _poll(self) -> None:
        holes = self._holes
        last = self._last if holes is None else holes.last
        version = DataVersion(self._engine, self._tables) if self._engine.dialect.name == "sqlite" else None
        watch = self._watch
        pace = Pace(self._poll_interval if watch is None else max(self._poll_interval, SAFETY_POLL))
        chase = 0  # polls left at the quick pace, awaiting a commit a file event announced
        try:
            while True:
                if watch is None:
                    written = False
                    self._stop.wait(pace.interval)
                else:
                    written = watch.wait(pace.interval)  # True: a process wrote the database's files
                if self._stop.is_set():
                    return
                if self._rewound.is_set():
                    self._rewound.clear()
                    last = 0
                    if version is not None:
                        version.close()  # its connection may have the replaced file open
                    self._resync()
                if version is None:  # MySQL: every poll costs a round trip, so a steady pace
                    last = self._read_after(last, holes)
                    continue
                before = last
                committed = version.changed()
                if committed:
                    last = self._read_after(last, holes, version)
                chase = 0 if committed else CHASE_POLLS if written else max(0, chase - 1)
                pace.step(changed=last != before or chase > 0)
        finally:
            if version is not None:
                version.close()

    def _read_after(self, last: int, holes: Holes | None, version: DataVersion | None = None) -> int:
        """Forward the change rows after revision ``last`` (read on ``version``'s connection where
        given); the new ``last`` (unchanged if the read failed: the next poll tries again)."""
        t = self._tables
        try:
            if version is not None:
                rows: Sequence[Any] = version.rows_after(last)
            else:
                with self._engine.connect() as conn:
                    rows = conn.execute(
                        select(t.changes).where(t.changes.c.revision > last).order_by(t.changes.c.revision)
                    ).all()
                    if holes is not None:
                        rows, resync = holes.settle(conn, t, rows)
        except (sqlite3.Error, sqlalchemy.exc.SQLAlchemyError) as exc:
            log.debug("polling the change log failed: %s", exc)
            if version is not None:
                version.close()
            return last
        if holes is None:
            resync = bool(rows) and rows[0].revision != last + 1
        if resync:
            self._resync()
        for row in rows:
            self._forward(row.kind, row.name)
        if holes is not None:
            return holes.last
        return rows[-1].revision if rows else last

    def _listen(self) -> None:
        """Forward the notifications of a LISTEN connection, opened as the pool's are (TLS verified,
        timeouts; ``own_connection``); after it failed, open another and re-read every target."""
        import psycopg  # noqa: PLC0415 - the postgresql extra, absent for other schemes

        while not self._stop.is_set():
            try:
                with own_connection(self._engine) as conn:
                    self._listening = conn
                    try:
                        conn.execute(f'LISTEN "{channel(self._tables)}"')
                        self._resync()
                        while not self._stop.is_set():
                            for note in conn.notifies(timeout=LISTEN_WAIT):
                                _, kind, name = note.payload.split(statements.NOTIFY_SEPARATOR, 2)
                                self._forward(kind, name)
                    finally:
                        self._listening = None
            except (psycopg.Error, sqlalchemy.exc.DBAPIError) as exc:
                log.debug("the LISTEN connection failed: %s", describe_error(exc, self._engine))
                self._stop.wait(0.25)


class Pace:
    """SQLite's poll interval: ``AFTER_CHANGE_POLL`` after a poll that read changes (a reply to
    them may follow soon), then ``IDLE_GROWTH`` times longer after each quiet poll (a commit
    without changes, such as a lease renewal, is quiet), up to ``poll_interval``. An idle session
    polls every ``poll_interval``; a stream of changes is read every millisecond, each read a
    probe and one prepared statement on a connection of its own."""

    def __init__(self, poll_interval: float) -> None:
        self._slowest = poll_interval
        self.interval = poll_interval

    def step(self, *, changed: bool) -> None:
        """The last poll read changes, or not."""
        quicker = AFTER_CHANGE_POLL if changed else IDLE_GROWTH * self.interval
        self.interval = min(self._slowest, quicker)


class Holes:
    """MySQL's change-log position: ``last``, below which every revision was forwarded or never
    commits, and the revisions above it already forwarded (see the module docstring)."""

    def __init__(self, newest: int, committed: Iterable[int]) -> None:
        """At start: ``newest`` revision, and the ``committed`` ones of the last ``START_WINDOW`` (not
        news); those missing may still commit, and are then forwarded."""
        self.last = max(0, newest - START_WINDOW)
        self._forwarded: set[int] = set(committed)
        self._seen: dict[int, float] = {}  # hole -> when it was first seen (monotonic)

    def settle(self, conn: Connection, t: Tables, rows: Sequence[Any]) -> tuple[list[Any], bool]:
        """Of ``rows`` (revisions above ``last``, in order), those not yet forwarded; advance ``last``
        over revisions read or settled; and whether to re-read every target: holes more than
        ``START_WINDOW`` below the newest revision are settled without asking (rows pruned unread,
        or a stall of the poller), so changes may have been missed."""
        fresh = [row for row in rows if row.revision not in self._forwarded]
        self._forwarded.update(row.revision for row in fresh)
        newest = max(self._forwarded, default=self.last)
        resync = self.last < newest - START_WINDOW
        if resync:  # far behind (rows pruned unread, or a long stall): settle the old holes unasked
            self.last = newest - START_WINDOW
            self._forwarded = {revision for revision in self._forwarded if revision > self.last}
            self._seen = {revision: seen for revision, seen in self._seen.items() if revision > self.last}
        now = time.monotonic()
        while self.last < newest:
            revision = self.last + 1
            if revision not in self._forwarded:
                seen = self._seen.setdefault(revision, now)
                if now - seen < HOLE_SETTLE:
                    break
                row = _probe(conn, t, revision)
                if row is False:
                    break  # its transaction is still open
                if row is not None:
                    fresh.append(row)
                self._seen.pop(revision, None)
            self._forwarded.discard(revision)
            self.last = revision
        return fresh, resync


def _probe(conn: Connection, t: Tables, revision: int) -> Any:
    """The committed row of ``revision``, None if there is none, False while a transaction that
    inserted it is open (a share-lock read that would wait: ``NOWAIT``)."""
    query = select(t.changes).where(t.changes.c.revision == revision).with_for_update(read=True, nowait=True)
    try:
        with conn.begin_nested():
            return conn.execute(query).first()
    except sqlalchemy.exc.OperationalError:
        return False


class ChangeRow(NamedTuple):
    """One change-log row."""

    revision: int
    kind: str
    name: str


class DataVersion:
    """SQLite's ``PRAGMA data_version`` on a connection of its own, which never writes: it changes
    whenever another connection committed. A failed probe counts as a change (the caller reads).
    ``rows_after`` reads the change log on the same connection."""

    def __init__(self, engine: Engine, t: Tables) -> None:
        self._engine = engine
        self._connection: Any = None
        self._seen: object = None
        c = t.changes.c
        query = select(c.revision, c.kind, c.name).where(c.revision > bindparam("after")).order_by(c.revision)
        self._rows_after = str(query.compile(dialect=engine.dialect))

    def changed(self) -> bool:
        """True if a commit may have happened since the last call (always on the first)."""
        try:
            if self._connection is None:
                self._connection = self._engine.raw_connection()
            version = self._connection.cursor().execute("PRAGMA data_version").fetchone()[0]
        except (sqlite3.Error, sqlalchemy.exc.SQLAlchemyError) as exc:
            log.debug("PRAGMA data_version failed: %s", exc)
            self.close()
            return True
        changed: bool = version != self._seen
        self._seen = version
        return changed

    def rows_after(self, revision: int) -> list[ChangeRow]:
        """The change rows after ``revision``, in order (``sqlite3.Error`` if the read failed)."""
        if self._connection is None:
            self._connection = self._engine.raw_connection()
        cursor = self._connection.cursor()
        try:
            return [ChangeRow(*row) for row in cursor.execute(self._rows_after, (revision,))]
        finally:
            cursor.close()

    def close(self) -> None:
        """Give the connection back; the next probe opens another (and reports a change)."""
        connection, self._connection, self._seen = self._connection, None, None
        if connection is not None:
            connection.close()
