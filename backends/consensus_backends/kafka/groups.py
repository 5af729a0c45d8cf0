"""Membership and leader election on Kafka groups, and how observers read them.

A candidate is a :class:`Member` of the Kafka group
``<prefix>.election.<service>``; the members one session joined to any group
are the slots of one :class:`Member` of ``<prefix>.members``: a join adds a
slot and rejoins, a leave records the slot departed (``<Kafka member
id>#<token>``) and rejoins without it, the last leave leaves the Kafka group.
Observers read groups through :mod:`consensus_backends.kafka.rosters`; a membership
read first catches up with the log, so a ``leave`` that returned is seen.

The leadership lease each service's candidates compete for, its read, claim
and release, is :mod:`consensus_backends.kafka.election`'s; a rejected claim
(a stale view) asks for a new rebalance and tries again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from consensus_api.backend import Target, TargetKind
from consensus_api.errors import (
    ConsensusError,
    FencedError,
    MemberExistsError,
    NotAMemberError,
    SessionLostError,
)
from consensus_api.model import Leadership
from consensus_backends.kafka.client import Channel, GroupView
from consensus_backends.kafka.commandlog import CommandLog
from consensus_backends.kafka.departures import Departures
from consensus_backends.kafka.election import Election
from consensus_backends.kafka.errors import timeout_error, translate
from consensus_backends.kafka.loop import Selector
from consensus_backends.kafka.member import Member, Slot, start_member
from consensus_backends.kafka.protocol import ENTRY_SEP, Assignment
from consensus_backends.kafka.rosters import SETTLE_POLL, Rosters
from consensus_backends.kafka.settings import Settings
from consensus_backends.kafka.state import StateMachine

if TYPE_CHECKING:
    from consensus_backends.kafka.lease import Driver, Worker

log = logging.getLogger("consensus_api.kafka")

CLAIM_RETRY = 0.1
#: (is an election, group or service name, member or candidate id)
Key = tuple[bool, str, str]


class Groups:
    """The session's members and candidates; the host of the driver and the members' hooks."""

    def __init__(
        self,
        settings: Settings,
        channel: Channel,
        log_: CommandLog,
        state: StateMachine,
        *,
        worker: Worker,
        api_version: Any,
    ) -> None:
        self._settings = settings
        self._channel = channel
        self._log = log_
        self._state = state
        self._worker = worker
        self._api_version = api_version
        self._lock = threading.Lock()
        self._members: dict[Key, Member] = {}
        self._shared: Member | None = None  # the Member carrying this session's members of every group
        self._rosters = Rosters(settings, channel, state)
        self._departures = Departures(log_, channel)
        self._election = Election(settings, log_, state, self._rosters, self._holds_healthy)
        self._retired: set[Leadership] = set()
        self._net = Selector(settings)  # the IO thread of every member and candidate
        self._tearing_down = False
        self._cleaning = False
        self.driver: Driver | None = None

    # Membership (<https://consensus-api.github.io/consensus-api/spec/#6-groupmembership-kip-30-groupmembershipclient>)

    def join(self, group: str, member_id: str, data: bytes) -> None:
        """Join ``group`` as ``member_id``; returns once a generation accepted the member."""
        self._add(False, group, member_id, data)

    def leave(self, group: str, member_id: str) -> None:
        """Leave ``group``: a ``DEPART`` record, then LeaveGroup, so observers see the member gone at
        once; raises if the record was not acknowledged (the member is given up all the same)."""
        self._remove((False, group, member_id))

    def membership(self, group: str, *, reread: bool = False) -> dict[str, bytes]:
        """The live members of ``group`` and their data, as of a read after the log's end.

        ``reread``: the re-read after a reported change, which needs no catch-up with the log
        (a change is reported once the log applied what it depends on) and shares the first
        description requested since the report with the other re-reads of the group.
        """
        deadline = time.monotonic() + self._settings.request_timeout
        if not reread:
            self._log.sync(deadline)
        members_group = self._settings.layout.members_group
        return dict(self._rosters.entries(members_group, group, deadline, since_report=reread))

    # Election (<https://consensus-api.github.io/consensus-api/spec/#7-leaderelection-kip-30-leaderelectionclient>)

    def nominate(self, service: str, candidate_id: str) -> bool:
        """Become a candidate; True if it holds the lease once its first generation settles."""
        return self._add(True, service, candidate_id, b"")

    def resign(self, service: str, candidate_id: str) -> None:
        """Vacate the lease if held (``UNLEAD``), then leave the election group."""
        self._remove((True, service, candidate_id))

    def leadership(self, service: str) -> Leadership | None:
        """The lease in force, if its holder is still a member of the election group
        (``Election.leadership``)."""
        return self._election.leadership(service)

    def check_fence(self, fence: Leadership) -> None:
        """``FencedError`` if ``fence`` names a candidacy of this session that may be gone (before
        the log can tell: a lost session's lease stays in force until it is vacated or superseded)."""
        with self._lock:
            member = self._members.get((True, fence.service, fence.leader_id))
            retired = fence in self._retired
        if retired or (member is not None and not self._healthy(member)):
            raise FencedError(f"the leadership of {fence.service!r} (term {fence.term}) may have been lost")

    def close(self) -> None:
        """Vacate held leases, leave every group and stop the members' IO thread."""
        with self._lock:
            doomed = _distinct(self._members.values())
            self._members.clear()
            self._shared = None
        self._stop(doomed, time.monotonic() + min(self._settings.request_timeout, 2.0))
        self._net.shut(1.0)

    # Driver host

    def members(self) -> list[Member]:
        with self._lock:
            return _distinct(self._members.values())

    def teardown(self) -> None:
        with self._lock:
            doomed = _distinct(self._members.values())
            self._members.clear()
            self._shared = None
            self._tearing_down = True
        for member in doomed:
            member.stopping = True
            lease = self._state.lease(member.name)
            if member.election and (lease.leader, lease.member) == (member.own_id, member.kafka_id):
                with self._lock:
                    self._retired.add(Leadership(member.name, member.own_id, lease.term))
        self._worker.submit(lambda: self._finish_teardown(doomed))

    def recovered(self) -> bool:
        with self._lock:
            if self._tearing_down or self._cleaning:
                return False
            if not self._departures.pending():
                return True
            self._cleaning = True
        self._worker.submit(self._settle_departures)
        return False

    # Member hooks (IO thread: never block)

    def reporting(self, target: Target) -> None:
        """A change of ``target`` is about to be reported: its re-read must describe its group anew."""
        if target.kind is TargetKind.GROUP:
            self._rosters.reported(self._settings.layout.members_group)

    def fingerprint(self, target: Target, view: GroupView) -> object:
        """What changes whenever a read of ``target`` from ``view`` may answer differently."""
        if target.kind is TargetKind.GROUP:
            return self._rosters.fingerprint(self._settings.layout.members_group, target.name, view)
        return view.state, frozenset((kid, assignment) for kid, (_, assignment) in view.members.items())

    def assigned(self, member: Member, assignment: Assignment | None, sent: frozenset[str]) -> None:
        self._worker.submit(lambda: self._on_assignment(member, assignment, sent))

    def lost(self, member: Member) -> None:
        self.wake(member)

    def wake(self, member: Member | None = None) -> None:
        if self.driver is not None:
            self.driver.wake(member)

    # Internals

    def _add(self, election: bool, name: str, own_id: str, data: bytes) -> bool:
        kind = "candidate" if election else "member"
        key = (election, name, own_id)
        deadline = time.monotonic() + self._settings.request_timeout
        group_id = (
            self._settings.layout.election_id(name) if election else self._settings.layout.members_group
        )
        with self._lock:
            taken = key in self._members
            shared = None if election else self._shared
        if taken:
            raise MemberExistsError(f"a live {kind} {own_id!r} is already in {name!r}")
        if shared is not None and shared.fatal is None and self._healthy(shared):
            slot = shared.add(name, own_id, data)
            with self._lock:
                taken = slot is None or key in self._members
                if not taken:
                    self._members[key] = shared
            if slot is None or taken:
                raise MemberExistsError(f"a live {kind} {own_id!r} is already in {name!r}")
            self._rejoin(shared)
            return self._await(key, shared, slot, deadline)
        # An early answer for a member already seen; the group leader rejects any later duplicate.
        known = self._rosters.entries(group_id, name, deadline, settle=False)
        if own_id in {i for i, _ in known}:
            raise MemberExistsError(f"a live {kind} {own_id!r} is already in {name!r}")
        lease_view = (lambda: self._election.lease_view(name)) if election else None
        member = start_member(
            lambda: Member(
                self._settings,
                self._api_version,
                group_id,
                name=name,
                own_id=own_id,
                data=data,
                hooks=self,
                lease_view=lease_view,
                net=self._net,
                heartbeat_ms=self._settings.member_heartbeat_ms,
            ),
            self._channel,
            deadline,
            f"the {kind} {own_id!r}",
        )
        with self._lock:
            taken = key in self._members
            if not taken:
                self._members[key] = member
                if not election:
                    self._shared = member
        if taken:
            member.stop(self._channel, deadline)
            raise MemberExistsError(f"a live {kind} {own_id!r} is already in {name!r}")
        self.wake(member)
        return self._await(key, member, member.first, deadline)

    def _await(self, key: Key, member: Member, slot: Slot, deadline: float) -> bool:
        """Wait for ``slot``'s first outcome; give the slot up unless it was accepted."""
        while not slot.settled.wait(SETTLE_POLL) and time.monotonic() < deadline and not member.stopping:
            pass
        if member.stopping:
            raise SessionLostError(f"the session was lost while {key[2]!r} was joining {key[1]!r}")
        outcome = slot.outcome
        if slot.settled.is_set() and isinstance(outcome, bool):
            return outcome
        if slot.since >= 0 and not slot.settled.is_set():
            return False  # accepted; its claim of the lease is still under way
        with self._lock:
            if self._members.get(key) is member:
                del self._members[key]
        self._release(member, slot, time.monotonic() + min(self._settings.request_timeout, 2.0))
        if isinstance(outcome, BaseException):
            raise translate(outcome, f"joining {key[1]!r} as {key[2]!r}")
        raise timeout_error(f"{key[2]!r} to join {key[1]!r}")

    def _remove(self, key: Key) -> None:
        with self._lock:
            member = self._members.pop(key, None)
        if member is None:
            kind = "candidate" if key[0] else "member"
            raise NotAMemberError(f"this session has no {kind} {key[2]!r} in {key[1]!r}")
        slot = member.slot(key[1], key[2])
        error = self._release(member, slot, time.monotonic() + self._settings.request_timeout)
        if error is not None:
            raise error

    def _release(self, member: Member, slot: Slot | None, deadline: float) -> ConsensusError | None:
        """Give up ``slot``: the whole member if it was its last (see ``_stop``), else a departure
        of the slot recorded and a rejoin without it; the error if the record failed."""
        if slot is None or member.drop(slot) == 0:
            with self._lock:
                if self._shared is member:
                    self._shared = None
            return self._stop([member], deadline)
        kafka_id = member.kafka_id
        error = None
        if kafka_id and slot.since >= 0:
            departure = (member.group_id, f"{kafka_id}{ENTRY_SEP}{slot.token}")
            error = self._departures.record([departure], deadline)
        self._rejoin(member)
        return error

    def _rejoin(self, member: Member) -> None:
        member.rejoin_at = time.monotonic()
        self.wake(member)

    def _stop(self, doomed: list[Member], deadline: float) -> ConsensusError | None:
        """Vacate leases, record the departures, then leave; the error if the record failed."""
        for member in doomed:
            member.stopping = True
        for member in doomed:
            if member.election:
                self._election.vacate(member, deadline)
        error = self._departures.record([(m.group_id, m.kafka_id) for m in doomed if m.kafka_id], deadline)
        for member in doomed:
            if not member.stop(self._channel, deadline) and member.kafka_id and error is None:
                self._departures.unleft((member.group_id, member.kafka_id))
        return error

    def _finish_teardown(self, doomed: list[Member]) -> None:
        try:
            self._stop(doomed, time.monotonic() + min(self._settings.request_timeout, 2.0))
        finally:
            with self._lock:
                self._tearing_down = False
            self.wake()

    def _settle_departures(self) -> None:
        try:
            self._departures.settle(time.monotonic() + min(self._settings.request_timeout, 2.0))
        finally:
            with self._lock:
                self._cleaning = False
            self.wake()

    def _healthy(self, member: Member) -> bool:
        return not (member.stopping or member.lost or member.overdue(self._settings.session_timeout))

    def _holds_healthy(self, kafka_id: str) -> bool:
        """Whether a candidate of this session is the Kafka member ``kafka_id`` and healthy."""
        with self._lock:
            ours = [m for m in self._members.values() if m.election and m.kafka_id == kafka_id]
        return bool(ours) and self._healthy(ours[0])

    def _on_assignment(self, member: Member, assignment: Assignment | None, sent: frozenset[str]) -> None:
        if member.stopping or member.lost:
            return
        kind = "candidate" if member.election else "member"
        unsent = False
        for slot in member.slots():
            if slot.settled.is_set():
                continue
            if slot.token not in sent:
                unsent = True  # added after this JoinGroup went out: the next one names it
            elif assignment is None:
                slot.settle(ConsensusError(f"unreadable assignment in {member.group_id!r}"))
            elif not assignment.accepted or slot.token in assignment.rejected:
                slot.settle(MemberExistsError(f"a live {kind} {slot.id!r} is already in {slot.group!r}"))
            elif not member.election:
                slot.settle(True)
        if unsent:
            self._rejoin(member)
        if not member.election or assignment is None or not assignment.accepted:
            return
        if assignment.leader != member.kafka_id:
            member.first.settle(False)
            return
        stable = member.generation_if_stable()
        if stable is None or stable.generation_id != assignment.generation:
            return
        if self._election.claim(member, assignment):
            member.first.settle(True)
        else:
            member.rejoin_at = time.monotonic() + CLAIM_RETRY
            self.wake(member)


def _distinct(members: Iterable[Member]) -> list[Member]:
    """``members`` without repeats (one Member carries all of a session's members)."""
    return list({id(member): member for member in members}.values())
