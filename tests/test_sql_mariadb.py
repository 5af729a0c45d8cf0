"""SQL backend on MariaDB (and its MySQL schemes): how a transaction whose client stalls inside it
is bounded, names as exact bytes, the change log's holes, the test server's password."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy
from sqlalchemy.engine import Connection

import consensus_api as ca
from consensus_api import ValueChanged, registry
from consensus_api.config import BackendURL, Options, Secret, Security, parse_url
from consensus_backends.sql.client import create, stall_limit
from consensus_testkit import ServerHandle, start_server
from consensus_testkit.conformance.helpers import EventLog


@pytest.fixture
def mariadb_target(mariadb_server: ServerHandle) -> str:
    """A MariaDB URL whose table prefix no other test uses."""
    return f"{mariadb_server.url}?table_prefix=m{uuid.uuid4().hex[:8]}_"


def test_mariadb_ends_a_transaction_whose_client_stalls(mariadb_target: str) -> None:
    """Each connection reads committed data and is bounded as the module docstring of ``mysql`` says;
    a transaction left idle past the stall limit (whole seconds) is ended by the server, its connection
    closed, and the backend's next call on the engine goes on."""
    url, query = parse_url(mariadb_target)
    settings = Options(session_timeout=3.0, request_timeout=6.0, security=_credentials(url))
    table = f"{query['table_prefix']}stall"
    engine = create(url, settings)
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql(f"CREATE TABLE {table} (id INT PRIMARY KEY)")  # commits
            row = conn.exec_driver_sql(
                "SELECT @@tx_isolation, @@idle_transaction_timeout, @@innodb_lock_wait_timeout,"
                " @@max_statement_time"
            ).one()
            assert tuple(row) == ("READ-COMMITTED", 1, 2, 6.0)
            conn.exec_driver_sql(f"INSERT INTO {table} VALUES (1)")  # a transaction is open from here
            time.sleep(stall_limit(settings) + 1.0)
            with pytest.raises(sqlalchemy.exc.DBAPIError) as ended:
                conn.exec_driver_sql("SELECT 1")
        assert ended.value.connection_invalidated
        with engine.connect() as conn:
            assert conn.exec_driver_sql(f"SELECT COUNT(*) FROM {table}").scalar() == 0  # rolled back
    finally:
        engine.dispose()


def test_mariadb_names_are_exact_bytes(mariadb_target: str) -> None:
    """Keys and member ids differing only in case or trailing spaces are distinct (no collation folds
    them); a walk below a non-ASCII namespace finds exactly its keys; a 1 MiB value round-trips."""
    with ca.connect(mariadb_target) as session:
        for key in ("ns/K", "ns/k", "ns/k ", "nß/x", "nß/y/z", "nß0", "nßx/y"):
            session.storage.put(key, key.encode())
        assert session.storage.keys("ns") == {"ns/K", "ns/k", "ns/k "}
        assert [key for key, _ in session.storage.walk("nß")] == ["nß/x", "nß/y/z"]
        group = session.group("g")
        group.join("A", b"")
        group.join("a", b"")
        assert set(group.members()) == {"A", "a"}
        big = bytes(range(256)) * 4096
        session.storage.put("big", big)
        assert session.storage.fetch("big") == ca.Versioned(big, 1)


def test_mariadb_change_committed_after_a_later_one_reaches_listeners(mariadb_target: str) -> None:
    """InnoDB commits revisions out of order: a change whose transaction stays open while a later
    revision commits is still told to listeners when it commits (the feed waits on the hole)."""
    with ca.connect(mariadb_target) as session:
        session.storage.put("early", b"v1")
        early: EventLog[ValueChanged] = EventLog("early")
        late: EventLog[ValueChanged] = EventLog("late")
        session.listeners.add_value_listener("early", early)
        session.listeners.add_value_listener("late", late)
        early.wait_count(1)
        late.wait_count(1)
        with _uncommitted_update_of_early(mariadb_target):
            session.storage.put("late", b"after")  # a later revision, committed first
            late.wait_count(2)
            time.sleep(0.5)  # the hole is older than HOLE_SETTLE: the feed asks, finds it open
        assert early.wait_count(2)[1] == ValueChanged("early", b"v2", 2)


def _credentials(url: BackendURL) -> Security:
    """The URL's user and password, where ``connect`` puts them (``Options.security``)."""
    return Security(username=url.username, password=None if url.password is None else Secret(url.password))


@contextlib.contextmanager
def _uncommitted_update_of_early(target: str) -> Iterator[Connection]:
    """A transaction of its own that updates key ``early`` to ``b"v2"`` and logs the change, as the
    backend does, and stays open (its revision taken) until the block ends or it is committed."""
    url, query = parse_url(target)
    prefix = query["table_prefix"]
    engine = create(url, Options(security=_credentials(url)))
    try:
        with engine.connect() as slow, slow.begin():
            slow.exec_driver_sql(
                f"UPDATE {prefix}kv SET value = %s, version = version + 1 WHERE `key` = %s",
                (b"v2", b"early"),
            )
            slow.exec_driver_sql(f"INSERT INTO {prefix}changes (kind, name) VALUES ('value', 'early')")
            yield slow
    finally:
        engine.dispose()


def test_mysql_schemes_are_registered_and_bad_urls_refused_before_io() -> None:
    """Every MySQL/MariaDB scheme SQLAlchemy names is ours; a URL without a database or with two hosts
    is a ConfigurationError before any connection."""
    assert {"mysql", "mysql+pymysql", "mariadb", "mariadb+pymysql"} <= registry.schemes()
    for url in ("mariadb://u:p@127.0.0.1:1/", "mysql+pymysql://u:p@127.0.0.1:1,127.0.0.1:2/db"):
        with pytest.raises(ca.ConfigurationError, match="one host and a database"):
            create(parse_url(url)[0], Options())


def test_mariadb_launcher_keeps_its_password_off_command_lines(tmp_path: Path) -> None:
    """The test server runs with grant tables and a password user: the password is in the URL and a
    0600 init file only, not in the server's command line nor the handle's repr; a commit survives a
    SIGKILL and restart."""
    with start_server("mariadb", tmp_path) as server:
        url = parse_url(server.url)[0]
        assert url.password
        assert url.password not in Path(f"/proc/{server.pid}/cmdline").read_text(errors="replace")
        assert url.password not in repr(server)
        assert (server.directory / "init.sql").stat().st_mode & 0o777 == 0o600
        with pytest.raises(ca.ConfigurationError, match="authentication failed"):  # at once, never retried
            ca.connect(server.url.replace(url.password, "wrong"), connect_timeout=1).close()
        with ca.connect(server.url) as session:
            version = session.storage.put("kept", b"v")
        server.kill()
        server.restart()
        with ca.connect(server.url) as session:
            assert session.storage.fetch("kept") == ca.Versioned(b"v", version)


def test_mariadb_change_in_flight_when_a_session_opens_reaches_its_listeners(mariadb_target: str) -> None:
    """A revision taken before a session opened, below a later committed one, whose transaction
    commits after the session's feed started, is still told to the session's listeners."""
    with ca.connect(mariadb_target) as writer:
        writer.storage.put("early", b"v1")
        with _uncommitted_update_of_early(mariadb_target) as slow:
            writer.storage.put("later", b"x")  # a later revision, committed first
            with ca.connect(mariadb_target) as session:
                early: EventLog[ValueChanged] = EventLog("early")
                session.listeners.add_value_listener("early", early)
                assert early.wait_count(1)[0] == ValueChanged("early", b"v1", 1)
                slow.commit()
                assert early.wait_count(2)[1] == ValueChanged("early", b"v2", 2)
