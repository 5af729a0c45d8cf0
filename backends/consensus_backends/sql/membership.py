"""Group membership: a member is a row that references its session's lease row, inside the caller's
transaction.

Member ids are unique per group (the primary key): a join inserts its row only
if no row holds the id, and deletes none. A member lives as long as its
session's lease (``lease``): it is deleted with the lease, so a dead session's
members go when its lease expires and is reaped.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import Connection, and_

from consensus_api.backend import Target, TargetKind
from consensus_api.errors import MemberExistsError, NotAMemberError
from consensus_backends.sql import statements
from consensus_backends.sql.changes import log_changes
from consensus_backends.sql.dialect import delete_returning
from consensus_backends.sql.layout import Tables
from consensus_backends.sql.lease import reap_expired


def join(  # noqa: PLR0917
    conn: Connection, t: Tables, session_id: str, group: str, member_id: str, data: bytes
) -> None:
    """Add a member; ``MemberExistsError`` if a live one has that id.

    Expired leases are reaped only when the id is taken (by one of them, maybe):
    every session's heartbeat reaps them anyway, so a join costs no read of the leases.
    """
    row = {"grp": group, "member_id": member_id, "session_id": session_id, "data": data}
    insert = statements.of(conn, t).join
    if not insert.run(conn, row):
        reap_expired(conn, t)
        if not insert.run(conn, row):
            raise MemberExistsError(f"group {group!r} already has a live member {member_id!r}")
    log_changes(conn, t, [Target(TargetKind.GROUP, group)])


def leave(conn: Connection, t: Tables, session_id: str, group: str, member_id: str) -> None:
    """Remove this session's member; ``NotAMemberError`` if it holds none."""
    m = t.members.c
    mine = and_(m.grp == group, m.member_id == member_id, m.session_id == session_id)
    if not delete_returning(conn, t.members, mine, m.member_id):
        raise NotAMemberError(f"this session has no member {member_id!r} in group {group!r}")
    log_changes(conn, t, [Target(TargetKind.GROUP, group)])


def membership(conn: Connection, t: Tables, group: str) -> dict[str, bytes]:
    """The members of ``group`` and their data."""
    return members(conn.execute(statements.of(conn, t).membership, {"b_group": group}))


def members(rows: Iterable[Any]) -> dict[str, bytes]:
    """The rows of the ``membership`` statement as what ``membership`` returns."""
    return {row.member_id: bytes(row.data) for row in rows}
