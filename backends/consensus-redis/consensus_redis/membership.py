"""Group membership: a hash per group (member -> data, member -> session), kept by Lua scripts.

Guarantees: ``join`` and ``leave`` are one script each, run as this session
(``lease.Lease.call``): a join fails if a live member holds the id; a member
belongs to its session's key and goes with it. ``membership`` is one script that
first drops the members of dead sessions, so it never returns one.
"""

from __future__ import annotations

from consensus_api.errors import MemberExistsError, NotAMemberError
from consensus_redis import scripts
from consensus_redis.client import RedisClient, Script
from consensus_redis.layout import Layout
from consensus_redis.lease import Lease

JOIN, LEAVE, MEMBERSHIP = Script(scripts.JOIN), Script(scripts.LEAVE), Script(scripts.MEMBERSHIP)


class Membership:
    """The members of one backend session; each call is bounded by ``request_timeout``."""

    def __init__(self, client: RedisClient, layout: Layout, lease: Lease) -> None:
        self._client = client
        self._layout = layout
        self._lease = lease

    def join(self, group: str, member_id: str, data: bytes) -> None:
        reply = self._lease.call(JOIN, group, member_id, data)
        if reply[0] == "exists":
            raise MemberExistsError(f"group {group!r} already has a live member {member_id!r}")

    def leave(self, group: str, member_id: str) -> None:
        reply = self._lease.call(LEAVE, group, member_id)
        if reply[0] == "other":
            raise NotAMemberError(f"member {member_id!r} of group {group!r} is held by another session")

    def membership(self, group: str) -> dict[str, bytes]:
        reply = self._client.run(MEMBERSHIP, self._layout.prefix, group)
        pairs = reply[1]
        return {pairs[i].decode(): bytes(pairs[i + 1]) for i in range(0, len(pairs), 2)}
