"""A migration's seal of the store, the terms it has issued, and its live sessions.

The seal is one row of the ``seal`` table (``layout``): ``sealed`` true refuses
every ``put``, ``update`` and ``delete`` of every session on these tables with
``SealedError``; members, candidates and reads go on. A storage write checks it
in a statement it runs anyway: its first change-log row is inserted only while
that row says unsealed (``log_unsealed``); no row inserted means sealed, and
the transaction rolls back. The per-write cost is a primary-key read of a
one-row table inside that statement, no round trip of its own.

Why a write racing ``set_sealed(True)`` is either applied before the seal or
refused (the seal commits before ``seal()`` returns):

* SQLite: every write transaction, the seal's included, holds the database's
  one write lock from ``BEGIN IMMEDIATE`` to its end, so they run one after
  another and each reads what the previous committed.
* PostgreSQL, at READ COMMITTED: the seal first takes ``LOCK TABLE kv IN SHARE
  MODE``, which conflicts with the ROW EXCLUSIVE lock every storage write takes
  with its first statement on ``kv`` and holds until its end; the check runs in
  a later statement, whose snapshot is taken after that lock was granted. If
  the write got its lock first, the seal waits until the write has ended: the
  write was applied before it. Otherwise the write's statements on ``kv`` wait
  until the seal has committed, and the check's snapshot sees it: refused.
  Writers do not lock the seal row, so they do not contend on it.
* MySQL/MariaDB (InnoDB, READ COMMITTED): the check reads the seal row with a
  share lock (``LOCK IN SHARE MODE``), which reads the newest committed version
  and conflicts with the exclusive lock of the seal's ``UPDATE``. If the write
  locked the row first, the seal's ``UPDATE`` waits until the write has ended;
  otherwise the check waits until the seal has committed and reads it: refused.
  Share locks do not conflict with one another, so writers do not wait for each
  other here, and neither waits for anything the seal holds but the row itself:
  no deadlock.

``unseal`` needs no such order: a write racing it is refused or applied, both
allowed. The other refusals of a write (a missing key, a version conflict, a
stale fence) are reported as ``SealedError`` too while the store is sealed
(``refuse_if_sealed``), so every write on a sealed store says so.

Terms: each service's term lives in its ``leaders`` row, which is never deleted
and whose term never decreases; lock tokens are terms. So the highest of them
is a ceiling of every term issued, and never goes down.
"""

from __future__ import annotations

from sqlalchemy import Connection, func, select, text, update

from consensus_api.backend import Target
from consensus_api.errors import SealedError
from consensus_backends.sql import statements
from consensus_backends.sql.dialect import db_now
from consensus_backends.sql.layout import SEAL_ROW, Tables

SEALED_MESSAGE = "the store is sealed by a migration's cut-over; the write was not applied"


def log_unsealed(conn: Connection, t: Tables, target: Target) -> None:
    """Log that a storage write changed ``target`` if the store is unsealed, else ``SealedError``
    (the caller's transaction then rolls back). Run after the write's first statement on ``kv``
    (see the module docstring)."""
    params = {"b_kind": target.kind.value, "b_name": target.name}
    if not statements.of(conn, t).log_unsealed.run(conn, params):
        raise SealedError(SEALED_MESSAGE)


def refuse_if_sealed(conn: Connection, t: Tables) -> None:
    """``SealedError`` if the store is sealed: a write about to fail for another reason says this."""
    if read_sealed(conn, t):
        raise SealedError(SEALED_MESSAGE)


def set_sealed(conn: Connection, t: Tables, sealed: bool) -> None:
    """Seal or unseal, in ``conn``'s write transaction (sealing waits for the writes in flight on
    PostgreSQL; see the module docstring)."""
    if sealed and conn.dialect.name == "postgresql":
        kv = conn.dialect.identifier_preparer.format_table(t.kv)  # quoted as SQLAlchemy created it
        conn.execute(text(f"LOCK TABLE {kv} IN SHARE MODE"))
    s = t.seal.c
    conn.execute(update(t.seal).where(s.id == SEAL_ROW).values(sealed=sealed))


def read_sealed(conn: Connection, t: Tables) -> bool:
    """Whether the store is sealed (what committed before this statement began)."""
    s = t.seal.c
    return bool(conn.execute(select(s.sealed).where(s.id == SEAL_ROW)).scalar())


def read_term_ceiling(conn: Connection, t: Tables) -> int:
    """The highest term of any service so far (0 before the first election)."""
    return int(conn.execute(select(func.coalesce(func.max(t.leaders.c.term), 0))).scalar_one())


def read_live_sessions(conn: Connection, t: Tables) -> frozenset[str]:
    """The ids of the lease rows not expired by the database clock."""
    s = t.sessions.c
    rows = conn.execute(select(s.id).where(s.expires_at >= db_now(conn.dialect.name)))
    return frozenset(rows.scalars())
