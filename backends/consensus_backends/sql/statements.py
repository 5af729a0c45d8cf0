"""The hot statements of the key-value operations, the change log (also its seal-checked form for
storage writes, see ``seal``), the fence check and the reads of members and leaders, built once.

Each is built per ``Tables`` and dialect with bind parameters (``:b_*``), so a
call only binds values: SQLAlchemy skips building the expression and its
cache key, which it memoizes per statement object, and finds the compiled
form in its cache. The SQL is the same as when built per call.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import Column, Connection, Executable, and_, bindparam, func, insert, select

from consensus_backends.sql.dialect import MYSQL_DIALECTS, InsertIfAbsent, UpdateReturning, db_now
from consensus_backends.sql.layout import SEAL_ROW, Tables

#: Separates the fields of a PostgreSQL change notification: ``revision<TAB>kind<TAB>name``.
NOTIFY_SEPARATOR = "\t"


def _bind(name: str, column: Column[Any]) -> Any:
    """The bind parameter ``b_<name>`` with ``column``'s type (MySQL encodes names as bytes)."""
    return bindparam(f"b_{name}", type_=column.type)


class Statements:
    """Prepared statements of one ``Tables`` on one dialect (``of`` builds them on first use)."""

    def __init__(self, t: Tables, dialect: str) -> None:
        self.dialect = dialect
        kv = t.kv.c
        key, live = kv.key == _bind("key", kv.key), kv.deleted.is_(False)
        self.fetch = select(kv.value, kv.version).where(key, live)
        self.keys = select(kv.key).where(kv.parent == _bind("parent", kv.parent), live)
        value = _bind("value", kv.value)
        at = and_(live, kv.version == _bind("version", kv.version))
        bumped = {"version": kv.version + 1}
        self.revive = self._update(t, key, kv.deleted.is_(True), {"value": value, **bumped, "deleted": False})
        self.update_live = self._update(t, key, live, {"value": value, **bumped})
        self.update_at = self._update(t, key, at, {"value": value, **bumped})
        self.delete_live = self._update(t, key, live, {"value": None, **bumped, "deleted": True})
        self.delete_at = self._update(t, key, at, {"value": None, **bumped, "deleted": True})
        self.create = InsertIfAbsent(dialect, t.kv, ["key"])
        self.log = self._log(t, dialect)
        self.log_unsealed = LogUnsealed(t, dialect)
        self.fence_lock, self.fence = self._fence(t, dialect)
        m, lc = t.members.c, t.leaders.c
        self.join = InsertIfAbsent(dialect, t.members, ["grp", "member_id"])
        self.membership = select(m.member_id, m.data).where(m.grp == _bind("group", m.grp))
        service = lc.service == _bind("service", lc.service)
        self.leadership = select(lc.leader_id, lc.term).where(service, lc.leader_id.is_not(None))

    def _update(self, t: Tables, key: Any, condition: Any, values: dict[str, Any]) -> UpdateReturning:
        """``UPDATE kv … RETURNING version``."""
        return UpdateReturning(self.dialect, t.kv, key, condition, values, t.kv.c.version)

    @staticmethod
    def _log(t: Tables, dialect: str) -> Executable:
        """Append one change row (``kind``, ``name``); on PostgreSQL the same statement sends its
        ``pg_notify`` (delivered at commit): one round trip."""
        c = t.changes.c
        row = {"kind": _bind("kind", c.kind), "name": _bind("name", c.name)}
        if dialect != "postgresql":
            return insert(t.changes).values(row)
        logged = insert(t.changes).values(row).returning(c.revision, c.kind, c.name).cte("logged")
        payload = func.concat_ws(NOTIFY_SEPARATOR, logged.c.revision, logged.c.kind, logged.c.name)
        return select(func.pg_notify(t.changes.name, payload)).select_from(logged)

    @staticmethod
    def _fence(t: Tables, dialect: str) -> tuple[Executable | None, Executable]:
        """The fence check's statements: the share lock of the leaders row where it needs its own
        (MySQL cannot lock one table of a join), and the read of term and leader."""
        lc, sc = t.leaders.c, t.sessions.c
        service = lc.service == _bind("service", lc.service)
        query = (
            select(lc.term, lc.leader_id)
            .join_from(t.leaders, t.sessions, lc.session_id == sc.id)
            .where(service, sc.expires_at >= db_now(dialect))
        )
        if dialect in MYSQL_DIALECTS:
            return select(lc.term).where(service).with_for_update(read=True), query
        if dialect == "postgresql":
            return None, query.with_for_update(read=True, of=t.leaders)
        return None, query


class LogUnsealed:
    """The change-log row of ``Statements.log``, inserted only while the seal row says unsealed
    (``INSERT … SELECT … FROM seal``; on MySQL/MariaDB the seal row is read with a share lock, see
    ``seal``); ``run(conn, params)`` is True if the row was inserted, False if the store is sealed."""

    def __init__(self, t: Tables, dialect: str) -> None:
        c, s = t.changes.c, t.seal.c
        unsealed = select(_bind("kind", c.kind), _bind("name", c.name)).where(
            s.id == SEAL_ROW, s.sealed.is_(False)
        )
        if dialect in MYSQL_DIALECTS:
            unsealed = unsealed.with_for_update(read=True)
        logged = insert(t.changes).from_select(["kind", "name"], unsealed)
        #: PostgreSQL: the rows of ``pg_notify`` (one per logged row) tell; elsewhere the row count.
        self._rows = dialect == "postgresql"
        if self._rows:
            cte = logged.returning(c.revision, c.kind, c.name).cte("logged")
            payload = func.concat_ws(NOTIFY_SEPARATOR, cte.c.revision, cte.c.kind, cte.c.name)
            self._statement: Executable = select(func.pg_notify(t.changes.name, payload)).select_from(cte)
        else:
            self._statement = logged

    def run(self, conn: Connection, params: Mapping[str, Any]) -> bool:
        """Insert the row for ``params`` (``b_kind``, ``b_name``) unless the store is sealed."""
        result = conn.execute(self._statement, params)
        return result.first() is not None if self._rows else result.rowcount == 1


def of(conn: Connection, t: Tables) -> Statements:
    """``t``'s statements for ``conn``'s dialect, built on first use."""
    return for_dialect(t, conn.dialect.name)


def for_dialect(t: Tables, dialect: str) -> Statements:
    """``t``'s statements for ``dialect``, built on first use."""
    built = t.statements
    if not isinstance(built, Statements) or built.dialect != dialect:
        built = t.statements = Statements(t, dialect)
    return built
