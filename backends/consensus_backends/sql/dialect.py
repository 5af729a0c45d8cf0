"""The few statements that differ between SQLite, PostgreSQL and MySQL/MariaDB, and the database clock.

MySQL has no ``ON CONFLICT`` and no ``RETURNING`` for ``UPDATE`` or ``DELETE``
(MariaDB lacks the former): there an ``UPDATE`` is followed by a read of the
row it changed (it holds the row's lock, so that read sees the change), a
``DELETE`` is preceded by a locking read of the rows it removes, and a
duplicate insert is recognised by its error (1062), which rolls back only its
own statement. Every MySQL transaction runs at ``READ COMMITTED`` (see
``client``), as PostgreSQL's do: each statement sees what committed before it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import sqlalchemy
from sqlalchemy import (
    Column,
    ColumnElement,
    Connection,
    Double,
    Executable,
    Float,
    Table,
    delete,
    func,
    insert,
    literal_column,
    select,
    update,
)
from sqlalchemy.dialects import sqlite

#: SQLAlchemy's names of MySQL and MariaDB.
MYSQL_DIALECTS = ("mysql", "mariadb")
#: MySQL's error number for a duplicate key.
ER_DUP_ENTRY = 1062


def is_mysql(conn: Connection) -> bool:
    """Whether ``conn`` talks to MySQL or MariaDB."""
    return conn.dialect.name in MYSQL_DIALECTS


def db_now(dialect: str) -> ColumnElement[float]:
    """The database server's clock in seconds since the epoch; never the client's."""
    if dialect == "postgresql":
        return func.extract("epoch", func.clock_timestamp()).cast(Float)
    if dialect in MYSQL_DIALECTS:
        return literal_column("(UNIX_TIMESTAMP(SYSDATE(6)) + 0E0)", Double)  # + 0E0: a DOUBLE
    return literal_column("((julianday('now') - 2440587.5) * 86400.0)", Float)


class InsertIfAbsent:
    """``INSERT … ON CONFLICT (index) DO NOTHING`` into ``table``, built once for ``dialect``;
    ``run(conn, row)`` is True if the row was inserted.

    Decided by ``RETURNING``: drivers do not all report a rowcount for it. On
    MySQL a plain ``INSERT`` whose duplicate-key error means "present"; any
    other integrity error (a missing lease) propagates.
    """

    def __init__(self, dialect: str, table: Table, index: Sequence[str]) -> None:
        self._mysql = dialect in MYSQL_DIALECTS
        if self._mysql:
            self._statement: Executable = insert(table)
        elif dialect == "postgresql":
            # PostgreSQL's dialect (2.3 MiB), loaded by SQLAlchemy itself only for a postgresql URL
            from sqlalchemy.dialects.postgresql import insert as postgresql_insert  # noqa: PLC0415

            upsert = postgresql_insert(table).on_conflict_do_nothing(index_elements=list(index))
            self._statement = upsert.returning(next(iter(table.primary_key.columns)))
        else:
            upsert_sqlite = sqlite.insert(table).on_conflict_do_nothing(index_elements=list(index))
            self._statement = upsert_sqlite.returning(next(iter(table.primary_key.columns)))

    def run(self, conn: Connection, row: Mapping[str, Any]) -> bool:
        """Insert ``row`` (a value for each column to set) unless its index entry is taken."""
        if not self._mysql:
            return conn.execute(self._statement, row).first() is not None
        try:
            conn.execute(self._statement, row)
        except sqlalchemy.exc.IntegrityError as exc:
            if exc.orig is None or exc.orig.args[0] != ER_DUP_ENTRY:
                raise
            return False
        return True


def insert_if_absent(conn: Connection, table: Table, index: Sequence[str], row: dict[str, Any]) -> bool:
    """``InsertIfAbsent`` built for this one call."""
    return InsertIfAbsent(conn.dialect.name, table, index).run(conn, row)


class UpdateReturning:
    """``UPDATE table SET values WHERE key AND condition RETURNING returning``, built once for
    ``dialect`` (bind parameters are given to ``run``); ``run`` gives the new value of
    ``returning`` in the single row ``key`` selects, or None if no row matched."""

    def __init__(  # noqa: PLR0917
        self,
        dialect: str,
        table: Table,
        key: ColumnElement[bool],
        condition: ColumnElement[bool],
        values: Mapping[str, Any],
        returning: Column[Any],
    ) -> None:
        statement = update(table).where(key, condition).values(**values)
        self._mysql = dialect in MYSQL_DIALECTS
        self._update: Executable = statement if self._mysql else statement.returning(returning)
        #: MySQL: the read of the row the UPDATE changed (it holds the row's lock).
        self._reread: Executable | None = select(returning).where(key) if self._mysql else None

    def run(self, conn: Connection, params: Mapping[str, Any] | None = None) -> Any:
        """Execute with ``params`` (the bind parameters)."""
        if self._reread is None:
            return conn.execute(self._update, params).scalar()
        if conn.execute(self._update, params).rowcount == 0:  # rows matched: CLIENT_FOUND_ROWS
            return None
        return conn.execute(self._reread, params).scalar()


def update_returning(
    conn: Connection,
    table: Table,
    key: ColumnElement[bool],
    condition: ColumnElement[bool],
    *,
    values: Mapping[str, Any],
    returning: Column[Any],
) -> Any:
    """``UpdateReturning`` built for this one call."""
    return UpdateReturning(conn.dialect.name, table, key, condition, values, returning).run(conn)


def delete_returning(
    conn: Connection, table: Table, condition: ColumnElement[bool], column: Column[Any]
) -> list[Any]:
    """``DELETE FROM table WHERE condition RETURNING column``: ``column`` of the deleted rows."""
    statement = delete(table).where(condition)
    if not is_mysql(conn):
        return list(conn.execute(statement.returning(column)).scalars())
    gone = list(conn.execute(select(column).where(condition).with_for_update()).scalars())
    if gone:
        conn.execute(statement)
    return gone


def lock_row(conn: Connection, table: Table, key: ColumnElement[bool], row: dict[str, Any]) -> None:
    """Lock the row ``key`` selects for update, inserting ``row`` first if there is none.

    On MySQL the row is locked before any insert is tried: a duplicate insert
    share-locks the row, and two transactions upgrading those shared locks
    would deadlock.
    """
    locking = select(*table.primary_key.columns).where(key).with_for_update()
    if is_mysql(conn) and conn.execute(locking).first() is not None:
        return
    insert_if_absent(conn, table, [c.name for c in table.primary_key.columns], row)
    if conn.dialect.name != "sqlite":  # SQLite's write transactions hold the database's write lock
        conn.execute(locking)
