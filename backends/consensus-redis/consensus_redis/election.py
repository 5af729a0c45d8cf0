"""Leader election: candidates by nomination order per service, the earliest live one leads.

Guarantees: ``nominate`` and ``resign`` are one script each, run as this
session (``lease.Lease.call``); a candidate belongs to its session's key and
goes with it. Each change of leader takes the next value of the service's term
counter (``INCR``), so a term has at most one leader and terms only grow.
``leadership`` is one script that first drops the candidates of dead sessions.
A fenced write checks the leader and term in its own script (``storage``).
"""

from __future__ import annotations

from consensus_api.errors import MemberExistsError, NotAMemberError
from consensus_api.model import Leadership
from consensus_redis import scripts
from consensus_redis.client import RedisClient, Script
from consensus_redis.layout import Layout
from consensus_redis.lease import Lease

NOMINATE, RESIGN, LEADERSHIP = Script(scripts.NOMINATE), Script(scripts.RESIGN), Script(scripts.LEADERSHIP)


class Election:
    """The candidacies of one backend session; each call is bounded by ``request_timeout``."""

    def __init__(self, client: RedisClient, layout: Layout, lease: Lease) -> None:
        self._client = client
        self._layout = layout
        self._lease = lease

    def nominate(self, service: str, candidate_id: str) -> bool:
        reply = self._lease.call(NOMINATE, service, candidate_id)
        if reply[0] == "exists":
            raise MemberExistsError(f"service {service!r} already has a live candidate {candidate_id!r}")
        return bool(reply[1])

    def resign(self, service: str, candidate_id: str) -> None:
        reply = self._lease.call(RESIGN, service, candidate_id)
        if reply[0] == "other":
            raise NotAMemberError(f"candidate {candidate_id!r} for {service!r} is held by another session")

    def leadership(self, service: str) -> Leadership | None:
        reply = self._client.run(LEADERSHIP, self._layout.prefix, service)
        if reply[0] == "missing":
            return None
        return Leadership(service, reply[1].decode(), int(reply[2]))
