"""The few statements that differ between SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, Table
from sqlalchemy.dialects import postgresql, sqlite


def insert_if_absent(conn: Connection, table: Table, index: Sequence[str], row: dict[str, Any]) -> bool:
    """``INSERT … ON CONFLICT (index) DO NOTHING``; True if the row was inserted.

    Decided by ``RETURNING``: drivers do not all report a rowcount for it.
    """
    dialect = postgresql if conn.dialect.name == "postgresql" else sqlite
    statement = dialect.insert(table).on_conflict_do_nothing(index_elements=list(index)).values(**row)
    key_column = next(iter(table.primary_key.columns))
    return conn.execute(statement.returning(key_column)).first() is not None
