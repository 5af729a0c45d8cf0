"""SQL backend: when a killed session's ephemeral state goes (SQLite); how a transaction whose
client stalls inside it is bounded (PostgreSQL) or reported (SQLite)."""

from __future__ import annotations

import signal
import sqlite3
import threading
import time
from pathlib import Path

import pytest
import sqlalchemy

import consensus_api as ca
from consensus_api import MembershipChanged, OperationTimeoutError
from consensus_api.config import Options, Security, parse_url
from consensus_api.conformance.worker import WorkerProcess
from consensus_backends.sql.engine import create, is_retryable, sqlite_write_lock_holder, stall_limit

SESSION_TIMEOUT = 12.0
#: How late after the lease's expiry the member may leave: REAP_SLACK, one heartbeat transaction, the
#: 25 ms change-log poll and the dispatcher take ~0.1 s (benchmarks: failover.py); the bound leaves a
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
            with pytest.raises(OperationTimeoutError, match=f"held by process {holder.pid}"):
                session.storage.put("blocked", b"x")
            assert session.storage.fetch("k") is not None  # reads go on (WAL)
        finally:
            holder.close()
        assert sqlite_write_lock_holder(str(tmp_path / "locked.db")) is None
        session.storage.put("after", b"x")
