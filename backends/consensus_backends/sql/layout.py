"""Where the SQL backend keeps everything: its tables, created idempotently on first connect.

Liveness is a lease row per session whose expiry is computed with the
database's clock only. Deleted keys stay as tombstones so a key's version
keeps increasing across delete and re-create. Every write appends to a
revision-numbered change log that feeds listeners. One row of the ``seal``
table says whether a migration sealed the store (``seal``); a database made
before that table existed gets it when a session opens. On MySQL/MariaDB, names
are stored as their UTF-8 bytes (``VARBINARY``): compared and ordered bytewise
as on SQLite, case- and space-sensitive, and short enough for InnoDB's
3072-byte index keys.
"""

from __future__ import annotations

import re
from typing import Any

from sqlalchemy import (
    Boolean,
    Column,
    Connection,
    Dialect,
    Double,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    UniqueConstraint,
    insert,
    select,
    text,
)
from sqlalchemy.dialects.mysql import MEDIUMBLOB, VARBINARY
from sqlalchemy.types import TypeDecorator, TypeEngine

from consensus_api.errors import ConfigurationError, OperationTimeoutError
from consensus_backends.sql.dialect import MYSQL_DIALECTS, insert_if_absent

SCHEMA_VERSION = 1
#: The ``id`` of the seal table's one row.
SEAL_ROW = 1
#: Table prefixes: they are spliced into SQL (table, trigger and LISTEN channel names) unquoted.
_TABLE_PREFIX_RE = re.compile(r"[A-Za-z0-9_]{1,40}")


def table_prefix(value: Any) -> str:
    """Parse a table prefix: 1-40 characters of A-Z a-z 0-9 _."""
    if not isinstance(value, str) or not _TABLE_PREFIX_RE.fullmatch(value):
        raise ValueError(f"expected 1-40 characters of A-Z a-z 0-9 _, got {value!r}")
    return value


#: Seconds ``Tables.create`` waits for the schema lock on MySQL/MariaDB.
SCHEMA_LOCK_WAIT = 30


class Utf8Bytes(TypeDecorator[str]):
    """A ``str`` stored as its UTF-8 bytes (``VARBINARY``; MySQL/MariaDB)."""

    impl = VARBINARY
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: Dialect) -> bytes | None:
        return None if value is None else value.encode()

    def process_result_value(self, value: Any, dialect: Dialect) -> str | None:
        return None if value is None else bytes(value).decode()


def name_type(chars: int, utf8_bytes: int) -> TypeEngine[str]:
    """Text of up to ``chars`` characters; ``utf8_bytes`` bytes on MySQL/MariaDB."""
    return String(chars).with_variant(Utf8Bytes(utf8_bytes), *MYSQL_DIALECTS)


KEY = name_type(1100, 1024)  # 1024 UTF-8 bytes fit in 1100 characters (keys.MAX_KEY_BYTES)
SEGMENT = name_type(300, 1020)  # member and candidate ids: 255 characters (keys.MAX_SEGMENT_CHARS)
BLOB = LargeBinary().with_variant(MEDIUMBLOB(), *MYSQL_DIALECTS)  # BLOB holds only 64 KiB there
SECONDS = Float().with_variant(Double(), *MYSQL_DIALECTS)  # FLOAT is single precision there


class Tables:
    """The backend's tables, named with a configurable prefix."""

    def __init__(self, prefix: str) -> None:
        self.metadata = MetaData()
        m = self.metadata
        self.schema = Table(f"{prefix}schema", m, Column("version", Integer, primary_key=True))
        self.sessions = Table(
            f"{prefix}sessions",
            m,
            Column("id", String(32), primary_key=True),
            Column("expires_at", SECONDS, nullable=False, index=True),
        )
        self.kv = Table(
            f"{prefix}kv",
            m,
            Column("key", KEY, primary_key=True),
            Column("parent", KEY, nullable=False),
            Column("value", BLOB, nullable=True),
            Column("version", Integer, nullable=False),
            Column("deleted", Boolean, nullable=False),
            Index(f"{prefix}kv_parent", "parent", "deleted"),
        )
        self.members = Table(
            f"{prefix}members",
            m,
            Column("grp", KEY, primary_key=True),
            Column("member_id", SEGMENT, primary_key=True),
            Column("session_id", String(32), ForeignKey(self.sessions.c.id), nullable=False, index=True),
            Column("data", BLOB, nullable=False),
        )
        self.candidates = Table(
            f"{prefix}candidates",
            m,
            Column("id", Integer, primary_key=True, autoincrement=True),
            Column("service", KEY, nullable=False),
            Column("candidate_id", SEGMENT, nullable=False),
            Column("session_id", String(32), ForeignKey(self.sessions.c.id), nullable=False, index=True),
            UniqueConstraint("service", "candidate_id", name=f"{prefix}candidates_unique"),
            sqlite_autoincrement=True,
        )
        self.leaders = Table(
            f"{prefix}leaders",
            m,
            Column("service", KEY, primary_key=True),
            Column("leader_id", SEGMENT, nullable=True),
            Column("candidate", Integer, nullable=True),
            Column("session_id", String(32), nullable=True),
            Column("term", Integer, nullable=False),
        )
        self.changes = Table(
            f"{prefix}changes",
            m,
            Column("revision", Integer, primary_key=True, autoincrement=True),
            Column("kind", String(10), nullable=False),
            Column("name", KEY, nullable=False),
            sqlite_autoincrement=True,
        )
        self.seal = Table(
            f"{prefix}seal",
            m,
            Column("id", Integer, primary_key=True, autoincrement=False),
            Column("sealed", Boolean, nullable=False),
        )
        #: The hot statements on these tables, built on first use and typed by ``statements.of``
        #: (which imports this module, so this one does not name their type).
        self.statements: object = None

    def create(self, conn: Connection) -> None:
        """Create missing tables and check the schema version, inside ``conn``'s transaction.

        Concurrent creators wait for one another: PostgreSQL takes a transaction
        lock; on MySQL/MariaDB, where DDL commits implicitly, a named lock that
        belongs to the connection (released here, or by the server when the
        connection ends).
        """
        if conn.dialect.name not in MYSQL_DIALECTS:
            if conn.dialect.name == "postgresql":
                conn.execute(text("SELECT pg_advisory_xact_lock(4242424242)"))
            self._create(conn)
            return
        lock = {"name": f"consensus-api:{self.schema.name}", "wait": SCHEMA_LOCK_WAIT}
        if conn.execute(text("SELECT GET_LOCK(:name, :wait)"), lock).scalar() != 1:
            raise OperationTimeoutError(f"another process held the lock {lock['name']!r} for too long")
        try:
            self._create(conn)
        finally:
            conn.execute(text("SELECT RELEASE_LOCK(:name)"), lock)

    def _create(self, conn: Connection) -> None:
        """Create what is missing (so an older database gains the seal table and its row)."""
        self.metadata.create_all(conn, checkfirst=True)
        insert_if_absent(conn, self.seal, ["id"], {"id": SEAL_ROW, "sealed": False})
        found = conn.execute(select(self.schema.c.version)).scalar()
        if found is None:
            conn.execute(insert(self.schema).values(version=SCHEMA_VERSION))
        elif found != SCHEMA_VERSION:
            raise ConfigurationError(
                f"the database holds consensus-api schema version {found}; this release needs "
                f"{SCHEMA_VERSION}: use another table_prefix or migrate the data"
            )
