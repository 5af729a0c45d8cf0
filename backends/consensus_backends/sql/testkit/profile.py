"""Test profiles of the SQL backend (``consensus_testkit.profile``): SQLite, PostgreSQL and
MariaDB (which also serves the ``mysql`` schemes: its launcher is the only server we test them on).

Detection delay: a lapsed lease is reaped at the next heartbeat of any session
(every ``session_timeout / 3``), then listeners are told (PostgreSQL NOTIFY;
SQLite polls every 10 ms, MariaDB every 25 ms). Server-side expiry: the session's lease row is set
to expired (``expires_at = 0``) by a connection of the test's own; the next
reaper drops its members and candidates.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from consensus_api.config import BackendURL
from consensus_backends.sql.dialect import MYSQL_DIALECTS
from consensus_backends.sql.testkit.freeze import stop_inside_write
from consensus_testkit.profile import TestProfile, moved_to_free_port


def _detection_delay(session_timeout: float) -> float:
    return session_timeout / 3 + 0.5


def _expiry_statement(identity: Mapping[str, Any]) -> tuple[str, str]:
    table = str(identity["sessions_table"])
    if not table.replace("_", "").isalnum():
        raise ValueError(f"unexpected sessions table name {table!r}")
    return f"UPDATE {table} SET expires_at = 0 WHERE id = ", str(identity["session_id"])


def _expire_sqlite(url: BackendURL, identity: Mapping[str, Any], timeout: float) -> None:
    statement, session_id = _expiry_statement(identity)
    connection = sqlite3.connect(url.path[1:], timeout=timeout, isolation_level=None)
    try:
        connection.execute(statement + "?", (session_id,))
    finally:
        connection.close()


def _expire_postgresql(url: BackendURL, identity: Mapping[str, Any], timeout: float) -> None:
    import psycopg  # noqa: PLC0415 - the postgresql extra, absent for other schemes

    statement, session_id = _expiry_statement(identity)
    endpoint = url.endpoints[0]
    with psycopg.connect(
        host=endpoint.host,
        port=endpoint.port or 5432,
        user=url.username,
        password=url.password,
        dbname=url.path.lstrip("/") or "postgres",
        connect_timeout=max(1, round(timeout)),
        autocommit=True,
    ) as connection:
        connection.execute((statement + "%s").encode(), (session_id,))


def _expire_mariadb(url: BackendURL, identity: Mapping[str, Any], timeout: float) -> None:
    import pymysql  # noqa: PLC0415 - the mysql extra

    statement, session_id = _expiry_statement(identity)
    endpoint = url.endpoints[0]
    files: Mapping[str, str | None] | None = identity.get("tls")
    tls: dict[str, Any] = {"ssl_disabled": True}
    if files is not None:  # the secure server: TLS, with the session's own CA and client certificate
        tls = {"ssl_ca": files["tls_ca"], "ssl_cert": files["tls_cert"], "ssl_key": files["tls_key"]}
        tls["ssl_verify_identity"] = True
    connection = pymysql.connect(
        host=endpoint.host,
        port=endpoint.port or 3306,
        user=url.username,
        password=url.password or "",
        database=url.path.strip("/"),
        connect_timeout=timeout,
        read_timeout=timeout,
        write_timeout=timeout,
        autocommit=True,
        **tls,
    )
    try:
        with connection.cursor() as cursor:
            cursor.execute(statement + "%s", (session_id,))
    finally:
        connection.close()


def _uncreatable_database(url: BackendURL, workdir: Path) -> BackendURL:
    """A database path below a regular file, which no one can create."""
    blocker = workdir / "not-a-directory"
    blocker.write_bytes(b"a file where the database's directory should be")
    return replace(url, path=f"/{blocker}/sub/ct.db")


#: Replication of a SQL server is the database's own (primary and standbys), outside what we test.
SQL_CLUSTER = "one database server: its replication (primary and standbys) is the database's own"

SQLITE = TestProfile(
    name="sqlite",
    server=None,
    detection_delay=_detection_delay,
    expire_session=_expire_sqlite,
    unreachable_url=_uncreatable_database,
    not_applicable={
        "requires_server": "SQLite has no server process",
        "secured_server": "SQLite has no server, so no TLS or passwords",
        "freezes_a_writer": "a process frozen inside a write holds SQLite's file lock: writers wait for it",
        "cluster": "SQLite is a file, not a replicated cluster",
    },
    credentials_in_url=False,
    stop_inside_write=stop_inside_write,
)

POSTGRESQL = TestProfile(
    name="postgresql",
    server="postgresql",
    detection_delay=_detection_delay,
    expire_session=_expire_postgresql,
    unreachable_url=moved_to_free_port,
    not_applicable={"database_file": "a database-file fault (SQLite only)", "cluster": SQL_CLUSTER},
    stop_inside_write=stop_inside_write,
)

MARIADB = TestProfile(
    name="mariadb",
    server="mariadb",
    detection_delay=_detection_delay,
    expire_session=_expire_mariadb,
    unreachable_url=moved_to_free_port,
    not_applicable={"database_file": "a database-file fault (SQLite only)", "cluster": SQL_CLUSTER},
    stop_inside_write=stop_inside_write,
)


def for_scheme(scheme: str) -> TestProfile:
    """The profile of the backend serving URLs with ``scheme``."""
    if scheme == "sqlite":
        return SQLITE
    return MARIADB if scheme.partition("+")[0] in MYSQL_DIALECTS else POSTGRESQL
