"""The SQL baseline: the statements of ``consensus_backends.sql.store`` through SQLAlchemy Core.

The statements run on tables of their own.

Per operation, one transaction with the same statements as the backend:
fetch = one ``SELECT``; put = ``UPDATE … RETURNING`` (revive a tombstone), then
``INSERT … ON CONFLICT DO NOTHING RETURNING`` and two change-log rows (each
with ``pg_notify`` on PostgreSQL); update with a version = ``UPDATE …
RETURNING`` and one change row; fenced update = the fence ``SELECT`` (``FOR
SHARE`` on PostgreSQL) first; keys = one ``SELECT``. SQLite writes begin with
``BEGIN IMMEDIATE`` in WAL mode with ``synchronous=NORMAL``, as the backend's.
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
    Connection,
    Float,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    and_,
    create_engine,
    event,
    func,
    insert,
    literal_column,
    select,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite

from consensus_api import config


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
        if self.sqlite:
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
            Column("key", String(1100), primary_key=True),
            Column("parent", String(1100), nullable=False, index=True),
            Column("value", LargeBinary),
            Column("version", Integer, nullable=False),
            Column("deleted", Boolean, nullable=False),
        )
        self.changes = Table(
            f"{prefix}changes",
            metadata,
            Column("revision", Integer, primary_key=True, autoincrement=True),
            Column("kind", String(10), nullable=False),
            Column("name", String(1100), nullable=False),
        )
        self.sessions = Table(
            f"{prefix}sessions",
            metadata,
            Column("id", String(32), primary_key=True),
            Column("expires_at", Float, nullable=False),
        )
        self.leaders = Table(
            f"{prefix}leaders",
            metadata,
            Column("service", String(1100), primary_key=True),
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

    def _now(self, conn: Connection) -> Any:
        if self.sqlite:
            return literal_column("((julianday('now') - 2440587.5) * 86400.0)", Float)
        return func.extract("epoch", func.clock_timestamp()).cast(Float)

    def _log(self, conn: Connection, kind: str, name: str) -> None:
        revision = conn.execute(
            insert(self.changes).values(kind=kind, name=name).returning(self.changes.c.revision)
        ).scalar_one()
        if not self.sqlite:
            conn.execute(select(func.pg_notify(self.changes.name, f"{revision}\t{kind}\t{name}")))

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
            revived = conn.execute(
                update(self.kv)
                .where(kv.key == key, kv.deleted.is_(True))
                .values(value=value, version=kv.version + 1, deleted=False)
                .returning(kv.version)
            ).scalar()
            if revived is None:
                dialect = sqlite if self.sqlite else postgresql
                row = {"key": key, "parent": key.rpartition("/")[0], "value": value, "version": 1}
                statement = dialect.insert(self.kv).on_conflict_do_nothing(index_elements=["key"])
                inserted = conn.execute(statement.values(**row, deleted=False).returning(kv.key)).first()
                if inserted is None:
                    raise RuntimeError("key exists")
                revived = 1
            self._log(conn, "value", key)
            self._log(conn, "keyset", key.rpartition("/")[0])
        return int(revived)

    def _update(self, conn: Connection, key: str, value: bytes, version: int | None) -> int:
        kv = self.kv.c
        condition = and_(kv.key == key, kv.deleted.is_(False))
        if version is not None:
            condition = and_(condition, kv.version == version)
        new_version = conn.execute(
            update(self.kv).where(condition).values(value=value, version=kv.version + 1).returning(kv.version)
        ).scalar()
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
                .where(lc.service == "fence", sc.expires_at >= self._now(conn))
            )
            if not self.sqlite:
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
