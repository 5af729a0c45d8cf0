"""The SQL baseline: the statements of ``consensus_backends.sql.storage`` through SQLAlchemy Core.

The statements run on tables of their own.

Per operation, one transaction with the same statements as the backend:
fetch = one ``SELECT``; put = ``UPDATE … RETURNING`` (revive a tombstone), then
``INSERT … ON CONFLICT DO NOTHING RETURNING`` and two change-log rows (on
PostgreSQL each one statement: an ``INSERT … RETURNING`` in a CTE whose
``SELECT`` sends its ``pg_notify``); update with a version = ``UPDATE …
RETURNING`` and one change row; fenced update = the fence ``SELECT`` (``FOR
SHARE`` on PostgreSQL) first; keys = one ``SELECT``. SQLite writes begin with
``BEGIN IMMEDIATE`` in WAL mode with ``synchronous=NORMAL``, as the backend's.
On MySQL/MariaDB (PyMySQL, ``READ COMMITTED``) the statements differ as the
backend's do: they come from ``consensus_backends.sql.dialect``, the column
types from ``consensus_backends.sql.layout``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import (
    URL,
    Boolean,
    Column,
    ColumnElement,
    Connection,
    Integer,
    MetaData,
    String,
    Table,
    and_,
    create_engine,
    event,
    func,
    insert,
    select,
)

from consensus_api import config
from consensus_backends.sql.dialect import (
    MYSQL_DIALECTS,
    db_now,
    insert_if_absent,
    is_mysql,
    update_returning,
)
from consensus_backends.sql.layout import BLOB, KEY, SECONDS


def postgresql_url(url: config.BackendURL) -> URL:
    """SQLAlchemy's URL (psycopg driver) of the PostgreSQL database ``url`` names; ``postgres`` by default."""
    endpoint = url.endpoints[0]
    return URL.create(
        "postgresql+psycopg",
        username=url.username,
        password=url.password,
        host=endpoint.host,
        port=endpoint.port,
        database=url.path.lstrip("/") or "postgres",
    )


class RawSQL:
    """SQLAlchemy Core on ``rawbench_<run>_*`` tables."""

    name = "SQLAlchemy Core"

    def __init__(self, url: config.BackendURL, run: str) -> None:
        self.sqlite = url.scheme == "sqlite"
        family = url.scheme.partition("+")[0]
        if family in MYSQL_DIALECTS:
            endpoint = url.endpoints[0]
            target = URL.create(
                f"{family}+pymysql",
                username=url.username,
                password=url.password,
                host=endpoint.host,
                port=endpoint.port or 3306,
                database=url.path.strip("/"),
                query={"charset": "utf8mb4"},
            )
            self.engine = create_engine(
                target, isolation_level="READ COMMITTED", pool_size=8, max_overflow=24
            )
        elif self.sqlite:
            target = URL.create("sqlite", database=url.path[1:])
            self.engine = create_engine(
                target,
                connect_args={"timeout": 10, "check_same_thread": False, "isolation_level": None},
                pool_size=8,
                max_overflow=24,
            )
            event.listen(self.engine, "connect", _sqlite_pragmas)
        else:
            self.engine = create_engine(postgresql_url(url), pool_size=8, max_overflow=24)
        metadata = MetaData()
        prefix = f"rawbench_{run}_"
        self.kv = Table(
            f"{prefix}kv",
            metadata,
            Column("key", KEY, primary_key=True),
            Column("parent", KEY, nullable=False, index=True),
            Column("value", BLOB),
            Column("version", Integer, nullable=False),
            Column("deleted", Boolean, nullable=False),
        )
        self.changes = Table(
            f"{prefix}changes",
            metadata,
            Column("revision", Integer, primary_key=True, autoincrement=True),
            Column("kind", String(10), nullable=False),
            Column("name", KEY, nullable=False),
        )
        self.sessions = Table(
            f"{prefix}sessions",
            metadata,
            Column("id", String(32), primary_key=True),
            Column("expires_at", SECONDS, nullable=False),
        )
        self.leaders = Table(
            f"{prefix}leaders",
            metadata,
            Column("service", KEY, primary_key=True),
            Column("session_id", String(32)),
            Column("term", Integer, nullable=False),
        )
        self.metadata = metadata
        with self._write() as conn:
            metadata.create_all(conn)
            conn.execute(insert(self.sessions).values(id=run, expires_at=time.time() + 86400))
            conn.execute(insert(self.leaders).values(service="fence", session_id=run, term=1))

    @contextmanager
    def _write(self) -> Iterator[Connection]:
        with self.engine.connect() as conn:
            if self.sqlite:
                conn.exec_driver_sql("BEGIN IMMEDIATE")
                yield conn
                conn.commit()
            else:
                with conn.begin():
                    yield conn

    def _log(self, conn: Connection, kind: str, name: str) -> None:
        row = insert(self.changes).values(kind=kind, name=name)
        if conn.dialect.name != "postgresql":
            conn.execute(row)
            return
        c = self.changes.c
        logged = row.returning(c.revision, c.kind, c.name).cte("logged")
        payload = func.concat_ws("\t", logged.c.revision, logged.c.kind, logged.c.name)
        conn.execute(select(func.pg_notify(self.changes.name, payload)).select_from(logged))

    def prepare(self, namespace: str) -> None:
        """Nothing to create: keys are rows (records)."""

    def fetch(self, key: str) -> object:
        kv = self.kv.c
        with self.engine.connect() as conn:
            if self.sqlite:
                conn.exec_driver_sql("BEGIN")
            row = conn.execute(
                select(kv.value, kv.version).where(kv.key == key, kv.deleted.is_(False))
            ).first()
            conn.commit()
        assert row is not None
        return bytes(row.value), row.version

    def put(self, key: str, value: bytes) -> int:
        kv = self.kv.c
        with self._write() as conn:
            revived = update_returning(
                conn,
                self.kv,
                kv.key == key,
                kv.deleted.is_(True),
                values={"value": value, "version": kv.version + 1, "deleted": False},
                returning=kv.version,
            )
            if revived is None:
                row = {"key": key, "parent": key.rpartition("/")[0], "value": value, "version": 1}
                if not insert_if_absent(conn, self.kv, ["key"], {**row, "deleted": False}):
                    raise RuntimeError("key exists")
                revived = 1
            self._log(conn, "value", key)
            self._log(conn, "keyset", key.rpartition("/")[0])
        return int(revived)

    def _update(self, conn: Connection, key: str, value: bytes, version: int | None) -> int:
        kv = self.kv.c
        condition: ColumnElement[bool] = kv.deleted.is_(False)
        if version is not None:
            condition = and_(condition, kv.version == version)
        new_version = update_returning(
            conn,
            self.kv,
            kv.key == key,
            condition,
            values={"value": value, "version": kv.version + 1},
            returning=kv.version,
        )
        if new_version is None:
            raise RuntimeError("missing or conflict")
        self._log(conn, "value", key)
        return int(new_version)

    def update(self, key: str, value: bytes, version: int) -> int:
        with self._write() as conn:
            return self._update(conn, key, value, version)

    def fenced_update(self, key: str, value: bytes) -> int:
        lc, sc = self.leaders.c, self.sessions.c
        with self._write() as conn:
            query = (
                select(lc.term)
                .join_from(self.leaders, self.sessions, lc.session_id == sc.id)
                .where(lc.service == "fence", sc.expires_at >= db_now(conn.dialect.name))
            )
            if is_mysql(conn):  # no lock on one table of a join there: the leaders row first
                conn.execute(select(lc.term).where(lc.service == "fence").with_for_update(read=True))
            elif not self.sqlite:
                query = query.with_for_update(read=True, of=self.leaders)
            if conn.execute(query).scalar() != 1:
                raise RuntimeError("fenced")
            return self._update(conn, key, value, None)

    def keys(self, namespace: str) -> frozenset[str]:
        kv = self.kv.c
        with self.engine.connect() as conn:
            if self.sqlite:
                conn.exec_driver_sql("BEGIN")
            rows = conn.execute(select(kv.key).where(kv.parent == namespace, kv.deleted.is_(False)))
            found = frozenset(row.key for row in rows)
            conn.commit()
        return found

    def close(self) -> None:
        try:
            with self._write() as conn:
                self.metadata.drop_all(conn)
        finally:
            self.engine.dispose()


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()
