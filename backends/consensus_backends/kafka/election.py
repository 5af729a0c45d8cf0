"""The leadership lease of each service, in the command log: its read, its claim and its release.

The leader of a service is the holder of the service's lease in the command
log (:mod:`consensus_backends.kafka.state`) while its Kafka member is still in the
election group. A candidate the assignment names leader claims the lease with
a ``LEAD`` command replacing the term named in the assignment; a rejected
claim (a stale view) asks for a new rebalance and tries again
(:mod:`consensus_backends.kafka.groups`, which drives the candidates).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from consensus_api.errors import ConsensusError
from consensus_api.model import Leadership
from consensus_backends.kafka.commandlog import CommandLog
from consensus_backends.kafka.member import Member
from consensus_backends.kafka.protocol import Assignment, LeaseView
from consensus_backends.kafka.records import Command, Op
from consensus_backends.kafka.rosters import SETTLE_POLL, Rosters
from consensus_backends.kafka.settings import Settings
from consensus_backends.kafka.state import Result, StateMachine

log = logging.getLogger("consensus_api.kafka")


class Election:
    """The session's view of the leases and its commands on them. ``holds_healthy(kafka_id)``:
    whether a candidate of this session is that Kafka member and still healthy."""

    def __init__(
        self,
        settings: Settings,
        log_: CommandLog,
        state: StateMachine,
        rosters: Rosters,
        holds_healthy: Callable[[str], bool],
    ) -> None:
        self._settings = settings
        self._log = log_
        self._state = state
        self._rosters = rosters
        self._holds_healthy = holds_healthy

    def leadership(self, service: str) -> Leadership | None:
        """The lease in force, if its holder is still a member of the election group.

        While the lease is vacant or its holder gone but candidates remain, a
        hand-over is under way: wait (at most ``session_timeout`` plus a
        second) for the next leader's claim rather than report nobody.
        """
        deadline = time.monotonic() + self._settings.request_timeout
        settle_by = time.monotonic() + min(self._settings.request_timeout, self._settings.session_timeout + 1)
        group_id = self._settings.layout.election_id(service)
        while True:
            self._log.sync(deadline)
            lease = self._state.lease(service)
            if lease.leader is not None and lease.member is not None and self._holds_healthy(lease.member):
                return Leadership(service, lease.leader, lease.term)
            present = set(self._rosters.describe(group_id, deadline).members) - self._state.departed(group_id)
            if lease.leader is not None and lease.member in present:
                return Leadership(service, lease.leader, lease.term)
            if not present or time.monotonic() + SETTLE_POLL >= settle_by:
                return None
            time.sleep(SETTLE_POLL)

    def lease_view(self, service: str) -> LeaseView:
        """(term, Kafka member id of the holder or None) as this session's log reader knows it."""
        lease = self._state.lease(service)
        return lease.term, lease.member if lease.leader is not None else None

    def claim(self, member: Member, assignment: Assignment) -> bool:
        """Claim the lease for ``member``, the leader ``assignment`` names (``LEAD`` replacing its
        term); True if it holds the lease, False if the claim was refused or failed (retry)."""
        deadline = time.monotonic() + self._settings.request_timeout
        try:
            self._log.sync(deadline)
            lease = self._state.lease(member.name)
            if lease.member == member.kafka_id and lease.leader == member.own_id:
                return True
            command = Command(
                Op.LEAD, member.name, candidate=member.own_id, member=member.kafka_id, term=assignment.prev
            )
            return self._log.command(command, deadline).result is Result.OK
        except ConsensusError as exc:
            log.info("claiming the lease of %r failed (%s); retrying", member.name, exc)
            return False

    def vacate(self, member: Member, deadline: float) -> None:
        """Vacate the lease ``member`` holds, if it does (``UNLEAD``); a failure is logged only."""
        lease = self._state.lease(member.name)
        if lease.leader != member.own_id or lease.member != member.kafka_id:
            return
        command = Command(
            Op.UNLEAD, member.name, candidate=member.own_id, member=member.kafka_id, term=lease.term
        )
        try:
            self._log.command(command, deadline)
        except ConsensusError as exc:
            log.info("could not vacate the lease of %r (%s)", member.name, exc)
