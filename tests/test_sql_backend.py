"""SQL backend on SQLite and PostgreSQL: when a killed session's ephemeral state goes; how a
transaction whose client stalls inside it is bounded (PostgreSQL) or reported (SQLite); SQLite's
change poll and file; PostgreSQL's change reader. MariaDB: ``test_sql_mariadb.py``."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import sqlalchemy

import consensus_api as ca
from consensus_api import MembershipChanged, OperationTimeoutError
from consensus_api.backend import WouldBlock
from consensus_api.config import Options, Security, parse_url
from consensus_backends.sql import storage as sql_storage
from consensus_backends.sql.changes import AFTER_CHANGE_POLL, IDLE_GROWTH, DataVersion, Pace
from consensus_backends.sql.client import create, stall_limit
from consensus_backends.sql.errors import is_retryable, sqlite_write_lock_holder
from consensus_backends.sql.layout import Tables
from consensus_backends.sql.rereads import ChangeReader
from consensus_backends.sql.watchdog import Watchdog
from consensus_testkit.conformance.helpers import EventLog, wait_until
from consensus_testkit.conformance.worker import WorkerProcess

ROOT = Path(__file__).resolve().parent.parent
SESSION_TIMEOUT = 12.0
#: How late after the lease's expiry the member may leave: REAP_SLACK, one heartbeat transaction, the
#: 10 ms change-log poll and the dispatcher take ~0.1 s (benchmarks: failover.py); the bound leaves a
#: loaded machine 1.5 s yet stays below the ~T/6 (2 s) a reap at the observer's next regular
#: heartbeat would come late.
REAP_BOUND = SESSION_TIMEOUT / 8


def _lease_left(database: Path, member_id: str) -> float:
    """Seconds until the lease of ``member_id``'s session expires, by the database clock."""
    with sqlite3.connect(database) as db:
        row = db.execute(
            "SELECT s.expires_at - (julianday('now') - 2440587.5) * 86400.0"
            " FROM consensus_members m JOIN consensus_sessions s ON s.id = m.session_id"
            " WHERE m.member_id = ?",
            (member_id,),
        ).fetchone()
    assert row is not None, f"no member {member_id!r}"
    return float(row[0])


def test_a_candidate_whose_lease_expired_is_never_made_leader(tmp_path: Path) -> None:
    """When the leader resigns, the next candidate in line whose session's lease has expired (by the
    database clock, not yet reaped) is passed over: the first live one leads, at the next term. (A
    chaos run once saw a lock granted to such a dead session, then to the next, 0.5 ms apart.)"""
    database = tmp_path / "expired.db"
    url, options = f"sqlite:///{database}", {"session_timeout": 60}  # no heartbeat reaps during the test
    with ca.connect(url, **options) as a, ca.connect(url, **options) as b, ca.connect(url, **options) as c:
        assert a.election("svc").nominate("a")
        assert not b.election("svc").nominate("b")
        assert not c.election("svc").nominate("c")
        with sqlite3.connect(database) as db:  # what the expire-session fault does to b
            db.execute(
                "UPDATE consensus_sessions SET expires_at = 0 WHERE id ="
                " (SELECT session_id FROM consensus_candidates WHERE candidate_id = 'b')"
            )
        a.election("svc").resign("a")
        leadership = c.election("svc").leadership()
        assert leadership is not None
        assert (leadership.leader_id, leadership.term) == ("c", 2)


def test_a_member_id_held_by_an_expired_lease_can_be_taken_before_any_heartbeat_reaps_it(
    tmp_path: Path,
) -> None:
    """A join finds the id taken by a session whose lease expired (by the database clock, not yet
    reaped): it reaps that lease and joins; observers see the new member's data. An id held by a
    live session is still refused."""
    database = tmp_path / "taken.db"
    url, options = f"sqlite:///{database}", {"session_timeout": 60}  # no heartbeat reaps during the test
    with ca.connect(url, **options) as old, ca.connect(url, **options) as new:
        old.group("g").join("w1", b"old")
        old.group("g").join("w2", b"old")
        with pytest.raises(ca.MemberExistsError):
            new.group("g").join("w1", b"new")
        with sqlite3.connect(database) as db:  # what the expire-session fault does to ``old``
            db.execute(
                "UPDATE consensus_sessions SET expires_at = 0 WHERE id ="
                " (SELECT session_id FROM consensus_members WHERE member_id = 'w1')"
            )
        new.group("g").join("w1", b"new")
        assert new.group("g").membership() == {"w1": b"new"}  # the expired lease went with both its members


def test_killed_session_leaves_as_its_lease_expires(tmp_path: Path) -> None:
    """A live session reaps a dead one when its lease expires, not up to a heartbeat period later."""
    database = tmp_path / "reap.db"
    url = f"sqlite:///{database}"
    options = {"session_timeout": SESSION_TIMEOUT}
    hold = ["--group", "workers", "--member", "doomed", "--service", "s", "--candidate", "c"]
    child = WorkerProcess(url, "hold", hold, options)
    try:
        child.expect("READY", 60)
        time.sleep(SESSION_TIMEOUT / 6)  # heartbeats out of phase: the next regular one comes ~T/6 late
        with ca.connect(url, **options) as observer:
            left_group = threading.Event()
            left_at: list[float] = []

            def on_change(event: MembershipChanged) -> None:
                if "doomed" not in event.members and not left_group.is_set():
                    left_at.append(time.monotonic())
                    left_group.set()

            observer.group("workers").add_listener(on_change)
            child.signal(signal.SIGKILL)
            asked = time.monotonic()
            expires_at = asked + _lease_left(database, "doomed")  # not later than the expiry
            assert left_group.wait(SESSION_TIMEOUT + 5), "the killed session's member never left"
            late = left_at[0] - expires_at
            assert 0 <= late < REAP_BOUND, f"left {late:.3f} s after its lease expired"
    finally:
        child.close()


def test_postgresql_ends_a_transaction_whose_client_stalls(postgresql_target: str) -> None:
    """A transaction left idle past ``stall_limit`` is ended by the server (its locks go with it), with
    an error the backend retries; no lock is waited for longer than twice that."""
    url = parse_url(postgresql_target)[0]
    settings = Options(session_timeout=3.0, request_timeout=6.0, security=Security(username=url.username))
    assert stall_limit(settings) == 1.0
    engine = create(url, settings)
    try:
        with engine.connect() as conn:
            assert conn.exec_driver_sql("SHOW lock_timeout").scalar() == "2s"
            assert conn.exec_driver_sql("SHOW idle_in_transaction_session_timeout").scalar() == "1s"
            conn.exec_driver_sql("SELECT 1")  # a transaction is open from here
            time.sleep(stall_limit(settings) + 0.5)
            with pytest.raises(sqlalchemy.exc.DBAPIError) as ended:
                conn.exec_driver_sql("SELECT 1")
        assert ended.value.connection_invalidated
        assert is_retryable(ended.value), ended.value
    finally:
        engine.dispose()


def test_sqlite_change_poll_reads_the_log_only_after_another_connection_committed(tmp_path: Path) -> None:
    """``DataVersion`` reports a change after a commit by any other connection (another process's
    included) and none otherwise; a closed probe reports one at its next call."""
    database = tmp_path / "version.db"
    engine = create(parse_url(f"sqlite:///{database}")[0], Options())
    probe = DataVersion(engine, Tables("consensus_"))
    try:
        assert probe.changed(), "the first probe always reads the log"
        assert not probe.changed()
        with sqlite3.connect(database) as other:
            other.execute("CREATE TABLE t (x)")
        assert probe.changed() and not probe.changed()
        subprocess.run(
            [
                sys.executable,
                "-c",
                f"import sqlite3; c = sqlite3.connect({str(database)!r}); "
                "c.execute('INSERT INTO t VALUES (1)'); c.commit()",
            ],
            check=True,
            timeout=30,
        )
        assert probe.changed() and not probe.changed()
        with sqlite3.connect(database) as reader:
            reader.execute("SELECT * FROM t").fetchall()
        assert not probe.changed(), "a read commits nothing"
        probe.close()
        assert probe.changed()
    finally:
        probe.close()
        engine.dispose()


def test_sqlite_change_poll_reads_the_rows_after_a_revision_on_its_own_connection(tmp_path: Path) -> None:
    database = tmp_path / "rows.db"
    engine = create(parse_url(f"sqlite:///{database}")[0], Options())
    tables = Tables("consensus_")
    tables.metadata.create_all(engine)
    probe = DataVersion(engine, tables)
    try:
        assert probe.rows_after(0) == []
        with sqlite3.connect(database) as other:
            other.executemany(
                "INSERT INTO consensus_changes (kind, name) VALUES (?, ?)",
                [("value", "a"), ("group", "g"), ("value", "a/b")],
            )
        assert probe.changed()
        assert probe.rows_after(0) == [(1, "value", "a"), (2, "group", "g"), (3, "value", "a/b")]
        assert [row.name for row in probe.rows_after(1)] == ["g", "a/b"]
        assert probe.rows_after(3) == []
    finally:
        probe.close()
        engine.dispose()


def test_sqlite_polls_soon_after_a_change_and_slows_down_while_quiet() -> None:
    pace = Pace(0.01)
    assert pace.interval == 0.01  # idle
    pace.step(changed=True)
    assert pace.interval == AFTER_CHANGE_POLL
    intervals = []
    for _ in range(8):
        pace.step(changed=False)
        intervals.append(pace.interval)
    assert intervals == pytest.approx([min(0.01, AFTER_CHANGE_POLL * IDLE_GROWTH**n) for n in range(1, 9)])
    assert intervals[0] < intervals[1] < 0.01 == intervals[-1]  # back to poll_interval while quiet
    pace.step(changed=True)
    pace.step(changed=True)  # a stream: read every millisecond
    assert pace.interval == AFTER_CHANGE_POLL
    shortest = Pace(0.001)  # the shortest poll_interval allowed: the pace cannot go below it
    shortest.step(changed=False)
    assert shortest.interval == 0.001


def test_sqlite_names_the_process_holding_the_write_lock(tmp_path: Path) -> None:
    """A write blocked by another process's write lock fails after request_timeout naming that process."""
    url = f"sqlite:///{tmp_path / 'locked.db'}"
    with ca.connect(url, request_timeout=0.5, session_timeout=30) as session:
        session.storage.put("k", b"v")
        assert sqlite_write_lock_holder(str(tmp_path / "locked.db")) is None
        holder = WorkerProcess(url, "sqlite-lock", ["--hold", "30"], {})
        try:
            holder.expect("READY", 30)
            assert sqlite_write_lock_holder(str(tmp_path / "locked.db")) == holder.pid
            with pytest.raises(OperationTimeoutError, match=f"held by process {holder.pid}") as refused:
                session.storage.put("blocked", b"x")
            assert refused.value.not_applied, "BEGIN IMMEDIATE never got the lock: nothing was written"
            assert session.storage.fetch("k") is not None  # reads go on (WAL)
        finally:
            holder.close()
        assert sqlite_write_lock_holder(str(tmp_path / "locked.db")) is None
        session.storage.put("after", b"x")


def test_sqlite_session_opens_on_a_new_file_whose_write_lock_another_process_holds(tmp_path: Path) -> None:
    """Opening a session waits for the write lock of a new database file (as when several processes
    start on it at once) and then creates the tables: the wait is no reason to renew a lease it has
    not opened yet."""
    path = tmp_path / "new.db"
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("PRAGMA journal_mode=WAL")
    other.execute("BEGIN IMMEDIATE")
    release = threading.Timer(1.5, other.rollback)
    release.start()
    try:
        options = {"session_timeout": 3, "request_timeout": 3, "connect_timeout": 10}
        with ca.connect(f"sqlite:///{path}", **options) as session:
            assert session.storage.put("k", b"v") == 1
    finally:
        release.join()
        other.close()


@pytest.mark.parametrize("value", [1e300, 0, 1e-9, "nan", float("inf"), 61])
def test_poll_interval_out_of_range_is_refused(tmp_path: Path, value: object) -> None:
    """poll_interval outside 1 ms to 60 s (1e300 silenced every listener) is a ConfigurationError."""
    with pytest.raises(ca.ConfigurationError, match="poll_interval"):
        ca.connect(f"sqlite:///{tmp_path / 'x.db'}", poll_interval=value)
    assert not (tmp_path / "x.db").exists()


@pytest.mark.parametrize("how", ["deleted", "replaced"])
def test_sqlite_file_deleted_or_replaced_loses_the_session(tmp_path: Path, how: str) -> None:
    """A session whose database file is deleted or replaced goes LOST within session_timeout / 3 and
    its fenced writes fail, so the leader a session on the new file elects (at term 1 again) is the
    only one writing; it then reopens on the new file and queues again."""
    database = tmp_path / "moved.db"
    url, timeout = f"sqlite:///{database}", 3.0
    with ca.connect(url, session_timeout=timeout) as old:
        states = EventLog[ca.SessionState]("old session states")
        old.add_state_listener(states)
        assert old.election("svc").nominate("a")
        old_fence = old.election("svc").leadership()
        assert old_fence is not None and old_fence.term == 1
        aside = tmp_path / "aside"
        aside.mkdir()
        for path in tmp_path.glob("moved.db*"):
            path.rename(aside / path.name)  # one rename per file: what rm or mv of moved.db* does
        if how == "replaced":
            sqlite3.connect(tmp_path / "fresh.db").close()
            (tmp_path / "fresh.db").rename(database)
        with ca.connect(url, session_timeout=timeout) as new:
            assert new.election("svc").nominate("b")
            new_fence = new.election("svc").leadership()
            assert new_fence == ca.Leadership("svc", "b", 1)  # the same term as the old leader's
            lost = states.wait_index(lambda state: state is ca.SessionState.LOST, timeout / 3 + 2)
            with pytest.raises((ca.FencedError, ca.SessionLostError)):
                old.storage.put("k", b"by a", fence=old_fence)
            with pytest.raises((ca.FencedError, ca.SessionLostError, WouldBlock)):
                old.storage.put_nowait("k", b"by a", fence=old_fence)  # nor through its held connection
            assert new.storage.put("k", b"by b", fence=new_fence) > 0
            states.wait_for(lambda state: state is ca.SessionState.CONNECTED, timeout + 2, since=lost + 1)
            wait_until(lambda: new.election("svc").leadership() == new_fence, 5, what="b still leads")
            assert old.storage.fetch("k") == new.storage.fetch("k")  # one file for both now
            assert old.storage.fetch_nowait("k") == new.storage.fetch("k")  # its held connection too
            with pytest.raises(ca.FencedError):
                old.storage.put("k2", b"by a", fence=old_fence)
            with pytest.raises(ca.FencedError):
                old.storage.put_nowait("k2", b"by a", fence=old_fence)


def test_sqlite_sessions_keep_their_leases_under_write_load(tmp_path: Path) -> None:
    """4 processes x 4 threads of compare-and-set writes on one key for 10 s (session_timeout 3 s,
    request_timeout 2 s): no session goes SUSPENDED or LOST, no write's effect is unknown, and the
    counter holds exactly the acknowledged increments (benchmarks/write_load.py, shortened)."""
    output = tmp_path / "load.json"
    command = [sys.executable, "-m", "benchmarks.write_load", f"sqlite:///{tmp_path / 'load.db'}"]
    command += ["--processes", "4", "--threads", "4", "--seconds", "10", "--output", str(output)]
    subprocess.run(command, cwd=ROOT, check=True, timeout=120, stdout=subprocess.DEVNULL)
    result = json.loads(output.read_text())
    assert result["acked"] > 0 and result["exact"], result
    assert (result["suspended"], result["lost"], result["unknown"], result["other_errors"]) == (0, 0, 0, 0), (
        result
    )


def test_sqlite_prepared_statements_are_built_once_and_shared_by_threads(tmp_path: Path) -> None:
    """The hot statements are built on first use and reused by every later call, on any thread,
    which each bind their own values."""
    with ca.connect(f"sqlite:///{tmp_path / 'prepared.db'}") as session:
        storage = session.storage
        storage.put("p/seed", b"0")
        built = session._backend._tables.statements  # type: ignore[attr-defined]
        assert built is not None

        def writer(thread: int) -> None:
            version = storage.put(f"p/{thread}", b"0")
            for value in range(1, 21):
                version = storage.update(f"p/{thread}", str(value).encode(), version=version)

        threads = [threading.Thread(target=writer, args=(thread,)) for thread in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert all(storage.fetch(f"p/{n}") == ca.Versioned(b"20", 21) for n in range(4))
        assert storage.keys("p") == {"p/seed", "p/0", "p/1", "p/2", "p/3"}
        assert session._backend._tables.statements is built  # type: ignore[attr-defined]


def test_postgresql_change_reader_replaces_a_connection_the_server_ended(postgresql_target: str) -> None:
    """The re-reads after a notification run on a connection of their own. When the server ends
    it (``pg_terminate_backend``, as a restart would), the next read answers on a new connection
    instead of failing: the listener does not wait for its retry."""
    url = parse_url(postgresql_target)[0]
    settings = Options(security=Security(username=url.username))
    engine = create(url, settings)
    tables = Tables(f"rr{uuid.uuid4().hex[:6]}_")
    reader = ChangeReader(engine, tables, Watchdog(), settings.request_timeout)
    try:
        with engine.begin() as conn:
            tables.create(conn)
            sql_storage.put(conn, tables, "a/k", b"v")
        assert reader.fetch("a/k") == ca.Versioned(b"v", 1)
        with engine.connect() as admin:
            ended = admin.execute(
                sqlalchemy.text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE query LIKE :read AND pid <> pg_backend_pid()"
                ),
                {"read": f"SELECT {tables.kv.name}.value%"},
            ).all()
        assert ended == [(True,)]
        assert reader.fetch("a/k") == ca.Versioned(b"v", 1)
        assert reader.keys("a") == frozenset({"a/k"})
        assert reader.membership("g") == {}
        assert reader.leadership("s") is None
    finally:
        reader.close()
        engine.dispose()
