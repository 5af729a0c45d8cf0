"""The few statements that differ between SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Connection, Table
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.sql.dml import Insert


def insert_ignore(conn: Connection, table: Table, index: Sequence[str]) -> Insert:
    """``INSERT … ON CONFLICT (index) DO NOTHING``: rowcount 0 when the row exists."""
    if conn.dialect.name == "postgresql":
        return postgresql.insert(table).on_conflict_do_nothing(index_elements=list(index))
    return sqlite.insert(table).on_conflict_do_nothing(index_elements=list(index))
