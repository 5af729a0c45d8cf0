"""Leader election: candidates queued per service, the first live one leads, inside the caller's
transaction.

The leader of a service is the live candidate inserted first; every change of
leader increments the service's term, which never decreases (the leaders row
outlives its leaders). Changes of candidates and leaders are serialized per
service by locking its leaders row first, in service order. Candidates reference
their session's lease row (``lease``) and are deleted with it. A fenced write
checks its leadership in its own transaction (``check_fence``).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, and_, select, update

from consensus_api.backend import Target, TargetKind
from consensus_api.errors import FencedError, MemberExistsError, NotAMemberError
from consensus_api.model import Leadership
from consensus_backends.sql import statements
from consensus_backends.sql.changes import log_changes
from consensus_backends.sql.dialect import db_now, delete_returning, insert_if_absent, lock_row
from consensus_backends.sql.layout import Tables
from consensus_backends.sql.seal import refuse_if_sealed


def nominate(conn: Connection, t: Tables, session_id: str, service: str, candidate_id: str) -> bool:
    """Queue a candidate; True if it leads now. ``MemberExistsError`` for a live duplicate."""
    lock_service(conn, t, service)
    row = {"service": service, "candidate_id": candidate_id, "session_id": session_id}
    if not insert_if_absent(conn, t.candidates, ["service", "candidate_id"], row):
        raise MemberExistsError(f"service {service!r} already has a live candidate {candidate_id!r}")
    leader = elect(conn, t, service)
    return leader is not None and leader.leader_id == candidate_id


def resign(conn: Connection, t: Tables, session_id: str, service: str, candidate_id: str) -> None:
    """Withdraw this session's candidate; ``NotAMemberError`` if it holds none."""
    lock_service(conn, t, service)
    c = t.candidates.c
    mine = and_(c.service == service, c.candidate_id == candidate_id, c.session_id == session_id)
    if not delete_returning(conn, t.candidates, mine, c.id):
        raise NotAMemberError(f"this session has no candidate {candidate_id!r} for {service!r}")
    elect(conn, t, service)


def leadership(conn: Connection, t: Tables, service: str) -> Leadership | None:
    """The current leader of ``service`` and its term."""
    return leader(service, conn.execute(statements.of(conn, t).leadership, {"b_service": service}).first())


def leader(service: str, row: Any) -> Leadership | None:
    """A row of the ``leadership`` statement (or None: no leader) as what ``leadership`` returns."""
    return None if row is None else Leadership(service, row.leader_id, row.term)


def check_fence(conn: Connection, t: Tables, fence: Leadership) -> None:
    """Raise ``FencedError`` unless ``fence`` (service, leader id and term) is current and its
    leader's lease unexpired.

    The leaders row stays share-locked until the transaction ends, so no change
    of leader can commit between this check and the fenced write. (MySQL cannot
    lock one table of a join: the row is locked by a statement of its own.) On a sealed store the
    refusal is ``SealedError``, as for every write there.
    """
    prepared = statements.of(conn, t)
    service = {"b_service": fence.service}
    if prepared.fence_lock is not None:
        conn.execute(prepared.fence_lock, service)
    row = conn.execute(prepared.fence, service).first()
    if row is None or (row.term, row.leader_id) != (fence.term, fence.leader_id):
        refuse_if_sealed(conn, t)
        raise FencedError(
            f"leadership of {fence.service!r} by {fence.leader_id!r} at term {fence.term} is not current"
            + (f" (the term is now {row.term})" if row is not None else " (nobody leads it now)")
        )


def lock_service(conn: Connection, t: Tables, service: str) -> None:
    lock_row(conn, t.leaders, t.leaders.c.service == service, {"service": service, "term": 0})


def elect(conn: Connection, t: Tables, service: str) -> Leadership | None:
    """Make the first live candidate the leader, with a new term if the leader changed.

    Live: its session's lease is unexpired by the database clock. A candidate whose lease expired
    is never made leader, though it stays queued until the lease is reaped (``reap_expired``, which
    elects again): it was dead already, and a lock granted to it would be granted to nobody.
    """
    c, lc, s = t.candidates.c, t.leaders.c, t.sessions.c
    live = and_(c.service == service, s.id == c.session_id, s.expires_at >= db_now(conn.dialect.name))
    first = conn.execute(
        select(c.id, c.candidate_id, c.session_id).where(live).order_by(c.id).limit(1)
    ).first()
    current = conn.execute(select(lc.candidate, lc.leader_id, lc.term).where(lc.service == service)).one()
    new_candidate = first.id if first is not None else None
    if current.candidate == new_candidate:
        return None if first is None else Leadership(service, current.leader_id, current.term)
    term = current.term + 1 if first is not None else current.term
    conn.execute(
        update(t.leaders)
        .where(lc.service == service)
        .values(
            candidate=new_candidate,
            leader_id=first.candidate_id if first is not None else None,
            session_id=first.session_id if first is not None else None,
            term=term,
        )
    )
    log_changes(conn, t, [Target(TargetKind.ELECTION, service)])
    return None if first is None else Leadership(service, first.candidate_id, term)
