"""Versioned key-value operations, each run inside the caller's transaction.

A deleted key stays as a tombstone row, so re-creating it continues from the
tombstone's version: versions strictly increase per key, always.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NoReturn

from sqlalchemy import Connection, func, select

from consensus_api.backend import Target, TargetKind
from consensus_api.errors import KeyExistsError, KeyNotFoundError, VersionConflictError
from consensus_api.keys import parent_of
from consensus_api.model import Versioned
from consensus_backends.sql import statements
from consensus_backends.sql.changes import log_changes
from consensus_backends.sql.dialect import is_mysql
from consensus_backends.sql.layout import Tables
from consensus_backends.sql.seal import log_unsealed, refuse_if_sealed


def fetch(conn: Connection, t: Tables, key: str) -> Versioned | None:
    """The live value of ``key``, or None."""
    return versioned(conn.execute(statements.of(conn, t).fetch, {"b_key": key}).first())


def versioned(row: Any) -> Versioned | None:
    """A row of the ``fetch`` statement (or None: no live key) as what ``fetch`` returns; by position,
    so also a plain tuple (the asyncio storage's rows, ``sql.aio``)."""
    return None if row is None else Versioned(bytes(row[0]), row[1])


def put(conn: Connection, t: Tables, key: str, value: bytes) -> int:
    """Create ``key`` (reviving a tombstone); ``KeyExistsError`` if it is live."""
    prepared = statements.of(conn, t)
    revived = prepared.revive.run(conn, {"b_key": key, "b_value": value})
    if revived is None:
        row = {"key": key, "parent": parent_of(key), "value": value, "version": 1, "deleted": False}
        if not prepared.create.run(conn, row):
            refuse_if_sealed(conn, t)
            raise KeyExistsError(f"key {key!r} already exists")
        revived = 1
    _log_key(conn, t, key)
    return int(revived)


def update_value(conn: Connection, t: Tables, key: str, value: bytes, version: int | None) -> int:
    """Replace the value of live ``key``, at ``version`` when given."""
    prepared = statements.of(conn, t)
    params = {"b_key": key, "b_value": value, "b_version": version}
    new_version = (prepared.update_live if version is None else prepared.update_at).run(conn, params)
    if new_version is None:
        _raise_missing_or_conflict(conn, t, key, version)
    log_unsealed(conn, t, Target(TargetKind.VALUE, key))
    return int(new_version)


def delete(conn: Connection, t: Tables, key: str, version: int | None) -> None:
    """Turn live ``key`` into a tombstone, at ``version`` when given."""
    prepared = statements.of(conn, t)
    params = {"b_key": key, "b_version": version}
    if (prepared.delete_live if version is None else prepared.delete_at).run(conn, params) is None:
        _raise_missing_or_conflict(conn, t, key, version)
    _log_key(conn, t, key)


def keys(conn: Connection, t: Tables, namespace: str) -> frozenset[str]:
    """The live keys exactly one level below ``namespace``."""
    return key_set(conn.execute(statements.of(conn, t).keys, {"b_parent": namespace}))


def key_set(rows: Iterable[Any]) -> frozenset[str]:
    """The rows of the ``keys`` statement as what ``keys`` returns (by position, as ``versioned``)."""
    return frozenset(row[0] for row in rows)


def walk_page(
    conn: Connection, t: Tables, namespace: str, after: str | None, limit: int
) -> list[tuple[str, Versioned]]:
    """Up to ``limit`` live keys below ``namespace`` that sort after ``after``, in key order.

    The prefix test is an exact ``substr`` comparison (no ``LIKE`` escaping, no
    reliance on the collation's order); on SQLite, whose collation is binary,
    the prefix is also one range of the primary key. On MySQL, whose keys are
    bytes (``SUBSTR`` would count bytes), that range is the whole test: with
    "0" right after "/", exactly the keys below ``namespace`` sort between
    ``namespace/`` and ``namespace0``.
    """
    kv = t.kv
    query = select(kv.c.key, kv.c.value, kv.c.version).where(kv.c.deleted.is_(False))
    if namespace:
        prefix = namespace + "/"
        if not is_mysql(conn):
            query = query.where(func.substr(kv.c.key, 1, len(prefix)) == prefix)
        if conn.dialect.name != "postgresql":
            query = query.where(kv.c.key > prefix, kv.c.key < namespace + "0")  # "0" follows "/"
    if after is not None:
        query = query.where(kv.c.key > after)
    rows = conn.execute(query.order_by(kv.c.key).limit(limit))
    return [(row.key, Versioned(bytes(row.value), row.version)) for row in rows]


def _raise_missing_or_conflict(conn: Connection, t: Tables, key: str, version: int | None) -> NoReturn:
    """Explain why a conditional statement matched no row.

    Without ``version`` only a missing key can explain it: a later read in the
    same transaction may already see the key re-created (PostgreSQL reads a new
    snapshot per statement), which must not turn into a version conflict.
    """
    refuse_if_sealed(conn, t)
    current = None if version is None else fetch(conn, t, key)
    if current is None:
        raise KeyNotFoundError(f"key {key!r} does not exist")
    raise VersionConflictError(f"key {key!r} is at version {current.version}, not {version}")


def _log_key(conn: Connection, t: Tables, key: str) -> None:
    """Log a change of ``key`` and of its parent's key set (``SealedError`` if sealed)."""
    log_unsealed(conn, t, Target(TargetKind.VALUE, key))
    log_changes(conn, t, [Target(TargetKind.KEYSET, parent_of(key))])
