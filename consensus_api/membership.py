"""Group membership (KIP-30 GroupMembershipClient).

Contract: <https://consensus-api.github.io/consensus-api/spec/#6-groupmembership-kip-30-groupmembershipclient>
"""

from __future__ import annotations

from collections.abc import Callable

from consensus_api._session_port import SessionPort
from consensus_api.backend import Target, TargetKind
from consensus_api.keys import check_segment, check_value
from consensus_api.model import MembershipChanged


class GroupMembership:
    """A named group of ephemeral members.

    A member lives as long as the session that joined it: it leaves on
    ``leave``, ``close`` or session loss (within ``session_timeout`` plus the
    backend's detection delay), and is re-joined after a loss when the session
    has ``auto_rejoin``.
    """

    def __init__(self, session: SessionPort, name: str) -> None:
        self._session = session
        self.name = name
        self._target = Target(TargetKind.GROUP, name)

    def join(self, member_id: str, data: bytes = b"") -> None:
        """Join as ``member_id``; ``MemberExistsError`` if a live member has that id."""
        member_id = check_segment(member_id, "member id")
        data = check_value(data, "member data")
        self._session.join(self.name, member_id, data)

    def leave(self, member_id: str) -> None:
        """Leave; ``NotAMemberError`` if this session has no member ``member_id``."""
        self._session.leave(self.name, check_segment(member_id, "member id"))

    def members(self) -> frozenset[str]:
        """The ids of the live members."""
        return frozenset(self.membership())

    def membership(self) -> dict[str, bytes]:
        """The live members and their data."""
        return self._session.backend_for_call().membership(self.name)

    def add_listener(self, callback: Callable[[MembershipChanged], None]) -> None:
        """Call ``callback`` with the membership now and after every change."""
        self._session.add_listener(self._target, callback)

    def remove_listener(self, callback: Callable[[MembershipChanged], None]) -> None:
        """Stop calling ``callback``."""
        self._session.remove_listener(self._target, callback)
