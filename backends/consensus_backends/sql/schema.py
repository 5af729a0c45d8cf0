"""Tables of the SQL backend, created idempotently on first connect.

Liveness is a lease row per session whose expiry is computed with the
database's clock only. Deleted keys stay as tombstones so a key's version
keeps increasing across delete and re-create. Every write appends to a
revision-numbered change log that feeds listeners.
"""

from __future__ import annotations

from sqlalchemy import (
    Boolean,
    Column,
    Connection,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    UniqueConstraint,
    func,
    insert,
    literal_column,
    select,
    text,
)
from sqlalchemy.sql.elements import ColumnElement

from consensus_api.errors import ConfigurationError

SCHEMA_VERSION = 1
KEY = String(1100)  # 1024 UTF-8 bytes fit in 1100 characters on every dialect


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
            Column("expires_at", Float, nullable=False, index=True),
        )
        self.kv = Table(
            f"{prefix}kv",
            m,
            Column("key", KEY, primary_key=True),
            Column("parent", KEY, nullable=False),
            Column("value", LargeBinary, nullable=True),
            Column("version", Integer, nullable=False),
            Column("deleted", Boolean, nullable=False),
            Index(f"{prefix}kv_parent", "parent", "deleted"),
        )
        self.members = Table(
            f"{prefix}members",
            m,
            Column("grp", KEY, primary_key=True),
            Column("member_id", String(300), primary_key=True),
            Column("session_id", String(32), ForeignKey(self.sessions.c.id), nullable=False, index=True),
            Column("data", LargeBinary, nullable=False),
        )
        self.candidates = Table(
            f"{prefix}candidates",
            m,
            Column("id", Integer, primary_key=True, autoincrement=True),
            Column("service", KEY, nullable=False),
            Column("candidate_id", String(300), nullable=False),
            Column("session_id", String(32), ForeignKey(self.sessions.c.id), nullable=False, index=True),
            UniqueConstraint("service", "candidate_id", name=f"{prefix}candidates_unique"),
            sqlite_autoincrement=True,
        )
        self.leaders = Table(
            f"{prefix}leaders",
            m,
            Column("service", KEY, primary_key=True),
            Column("leader_id", String(300), nullable=True),
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

    def create(self, conn: Connection) -> None:
        """Create missing tables and check the schema version, inside ``conn``'s transaction."""
        if conn.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(4242424242)"))
        self.metadata.create_all(conn, checkfirst=True)
        found = conn.execute(select(self.schema.c.version)).scalar()
        if found is None:
            conn.execute(insert(self.schema).values(version=SCHEMA_VERSION))
        elif found != SCHEMA_VERSION:
            raise ConfigurationError(
                f"the database holds consensus-api schema version {found}; this release needs "
                f"{SCHEMA_VERSION}: use another table_prefix or migrate the data"
            )


def db_now(dialect: str) -> ColumnElement[float]:
    """The database server's clock in seconds since the epoch; never the client's."""
    if dialect == "postgresql":
        return func.extract("epoch", func.clock_timestamp()).cast(Float)
    return literal_column("((julianday('now') - 2440587.5) * 86400.0)", Float)
