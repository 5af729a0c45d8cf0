"""Leader election with fencing terms (KIP-30 LeaderElectionClient).

Contract: <https://consensus-api.github.io/consensus-api/spec/#7-leaderelection-kip-30-leaderelectionclient>
"""

from __future__ import annotations

from collections.abc import Callable

from consensus_api._session_port import SessionPort
from consensus_api.backend import Target, TargetKind
from consensus_api.keys import check_segment
from consensus_api.model import LeaderChanged, Leadership


class LeaderElection:
    """Candidates queue for a service; the first in line leads.

    At most one leader per term; terms strictly increase across leaders and
    fence ``Storage`` writes. A leader whose session is lost gets
    ``LeaderChanged(service, None, None)`` before any other event, as soon as
    the backend reports the loss.
    """

    def __init__(self, session: SessionPort, service: str) -> None:
        self._session = session
        self.service = service
        self._target = Target(TargetKind.ELECTION, service)

    def nominate(self, candidate_id: str) -> bool:
        """Become a candidate; True if ``candidate_id`` leads now.

        The candidate stays in line until ``resign``, close or session loss;
        ``MemberExistsError`` if a live candidate already has that id.
        """
        return self._session.nominate(self.service, check_segment(candidate_id, "candidate id"))

    def resign(self, leader_id: str) -> None:
        """Give up leadership or candidacy; the next candidate takes over."""
        self._session.resign(self.service, check_segment(leader_id, "candidate id"))

    def leader(self) -> str | None:
        """The current leader's id, or None."""
        current = self.leadership()
        return current.leader_id if current else None

    def leadership(self) -> Leadership | None:
        """The current leader and its term (the fencing token), or None."""
        return self._session.backend_for_call().leadership(self.service)

    def add_listener(self, callback: Callable[[LeaderChanged], None]) -> None:
        """Call ``callback`` with the leader now and after every change."""
        self._session.add_listener(self._target, callback)

    def remove_listener(self, callback: Callable[[LeaderChanged], None]) -> None:
        """Stop calling ``callback``."""
        self._session.remove_listener(self._target, callback)
