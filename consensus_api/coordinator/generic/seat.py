"""A member's seat in a generic or incremental group: its membership, its candidacy in the
group's election, and the group's :class:`~.elected.ElectedRunner` (arbiter or steward), run
while it leads.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from consensus_api._session_port import SessionPort
from consensus_api.coordinator.generic.elected import ElectedRunner
from consensus_api.election import LeaderElection
from consensus_api.errors import MemberExistsError, NotAMemberError
from consensus_api.membership import GroupMembership
from consensus_api.model import LeaderChanged, Leadership

log = logging.getLogger("consensus_api.coordinator")


#: How many members of a group stand as candidates of its election (the smallest member ids).
CANDIDATES = 3


class Seat:
    """One member's place in a coordinated group ``root``: its membership, its candidacy in the
    election of the same name, and the ``runner`` (the group's coordinator) it runs while it leads.

    Only the ``CANDIDATES`` smallest member ids stand, a few standbys giving failover without an
    election as large as the group; while nobody leads, every member tries again to stand
    (``wake`` asks the owner's thread to ``take`` the seat), so the group never stays leaderless.

    With ``rejoin`` the session re-joins the member and candidacy after a loss (``auto_rejoin``,
    with the data of the first join); without it, ``take`` joins it afresh after ``lost``, with
    ``data()`` as it is then, under a new member id if ``lost(new_id)`` gave one (else once the
    lost session's member has expired).
    """

    def __init__(
        self,
        session: SessionPort,
        root: str,
        member_id: str,
        runner: ElectedRunner[Any],
        wake: Callable[[], None],
        *,
        rejoin: bool = True,
    ) -> None:
        self._session = session
        self._root = root
        self._id = member_id
        self._runner = runner
        self._wake = wake
        self._membership = GroupMembership(session, root)
        self._election = LeaderElection(session, root)
        self._rejoin = rejoin
        self._registered = False
        self._leaderless = True
        self._restand = False

    def take(self, data: Callable[[], bytes]) -> bool:
        """Join the group with ``data()`` unless joined, then stand if nobody leads. False (call
        again later) while a stale holder of the member id, such as this member before a session
        loss, has not expired yet. Called on the owner's thread."""
        if not self._registered:
            self._election.add_listener(self._on_leader)
            self._registered = self._join(data())
            if not self._registered:
                return False
        if self._leaderless or self._restand:
            self._stand()
            self._restand = False
        return True

    def lost(self, new_id: str | None = None) -> None:
        """The session was lost: the membership is void, ``take`` joins again (as ``new_id`` if
        given) and, without ``rejoin``, stands again."""
        if new_id is not None:
            self._id = new_id
        self._restand = self._restand or not self._rejoin  # the candidacy went with the session
        self._registered = False

    def close(self) -> None:
        """Stop the runner, then resign and leave (best effort: each step is tried, failures are
        logged)."""
        self._runner.stop()
        self._election.remove_listener(self._on_leader)
        leaves: list[Callable[[str], None]] = [self._election.resign, self._membership.leave]
        for leave in leaves:
            try:
                leave(self._id)
            except NotAMemberError:
                pass
            except Exception as exc:
                log.info("leaving group %r failed (%s)", self._root, exc)

    def _join(self, data: bytes) -> bool:
        try:
            if not self._session.holds_member(self._root, self._id):
                self._session.join(self._root, self._id, data, rejoin=self._rejoin)
        except MemberExistsError:
            log.info("member %s of %r still held by an expiring session; retrying", self._id, self._root)
            return False
        return True

    def _stand(self) -> None:
        if self._session.holds_candidacy(self._root, self._id):
            return
        if self._id in sorted(self._membership.members())[:CANDIDATES]:
            try:
                self._session.nominate(self._root, self._id, rejoin=self._rejoin)
            except MemberExistsError:
                log.info(
                    "candidate %s of %r still held by an expiring session; retrying", self._id, self._root
                )

    def _on_leader(self, event: LeaderChanged) -> None:
        self._leaderless = event.leader_id is None
        if event.leader_id == self._id and event.term is not None:
            self._runner.lead(Leadership(event.service, self._id, event.term))
        else:
            self._runner.lead(None)
        if self._leaderless:
            self._wake()  # stand as a candidate if among the first
