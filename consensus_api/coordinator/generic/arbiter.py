"""The arbiter of a generic group: what Kafka's broker-side group coordinator does, run by the
member that leads the group's election, on its own thread.

It drives the generation record (every write fenced by its leadership and
compared with the record's version, so a deposed arbiter changes nothing):

* ``stable`` -> ``preparing`` (generation + 1) when the admitted members
  differ from the generation's, or a member asked for a rebalance by joining
  the next generation early. Members are admitted in seniority order while
  they keep a protocol in common; the others are named ``rejected`` without a
  new generation, so an incompatible joiner never disturbs the group.
* ``preparing`` -> ``syncing`` once every awaited member wrote its join; a
  member that has not joined within ``rebalance_timeout`` (counted from the
  store's last return at the earliest, and its join still missing from a
  prompt read: :mod:`.elected`) is left out, also of later generations until
  it joins again (as Kafka removes it). The
  protocol is chosen from the joins (:func:`negotiation.choose`), the leader
  is kept from the last generation when possible.
* ``syncing`` -> ``stable`` once the leader's assignment is stored; the record
  names its version. A member leaving, or the leader not assigning within
  ``rebalance_timeout``, starts a new generation instead.

Static members (KIP-345) are sorted out first (:mod:`.static`): a restarted
one replaces its predecessor without a rebalance, a duplicate fences the
older, a gone one is kept for the session timeout.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from typing import TYPE_CHECKING

from consensus_api.coordinator.generic.elected import IDLE, ElectedRunner
from consensus_api.coordinator.generic.loop import Mirror, keyset_mirror, value_mirror
from consensus_api.coordinator.generic.negotiation import Offer, admit, choose
from consensus_api.coordinator.generic.records import (
    PREPARING,
    STABLE,
    SYNCING,
    Completed,
    GenerationRecord,
    JoinRecord,
    Layout,
    decode_offer,
)
from consensus_api.coordinator.generic.static import StaticMembers, StaticView, replace
from consensus_api.errors import ConsensusError, KeyNotFoundError
from consensus_api.model import KeySetChanged, Leadership, MembershipChanged, ValueChanged

if TYPE_CHECKING:
    from consensus_api._session_port import SessionPort

log = logging.getLogger("consensus_api.coordinator")


@dataclasses.dataclass(frozen=True, slots=True)
class _Turn:
    """What one step decides on: the record at ``version`` while ``lead`` holds, and the live
    members admitted in seniority order (``accepted``) or ``rejected`` for want of a protocol."""

    lead: Leadership
    record: GenerationRecord
    version: int | None
    accepted: list[str]
    rejected: list[str]


class Arbiter(ElectedRunner[GenerationRecord]):
    """Runs while its member leads the group's election (``lead``); idle otherwise."""

    def __init__(self, session: SessionPort, layout: Layout, own_id: str, rebalance_timeout: float) -> None:
        name = f"consensus-arbiter-{layout.group}"
        super().__init__(session, name, layout.root, layout.record, GenerationRecord.decode)
        self._layout = layout
        self._own = own_id
        self._timeout = rebalance_timeout
        self._joins: tuple[int, Mirror[KeySetChanged]] | None = None
        self._assignment: tuple[str, Mirror[ValueChanged]] | None = None
        self._round: tuple[int, str, float] = (-1, "", 0.0)
        self._timed_out: set[str] = set()
        self._statics = StaticMembers(session.settings.session_timeout)
        self._view = StaticView(frozenset(), (), {}, (), {})

    # The arbiter thread

    def _decide(
        self,
        leadership: Leadership,
        members: MembershipChanged,
        record: GenerationRecord | None,
        version: int | None,
    ) -> float:
        if record is None:
            self._write(leadership, GenerationRecord(0, STABLE), version)
            return 0.0
        offers = {member: decode_offer(data) for member, data in members.members.items()}
        self._view = view = self._statics.view(record, offers, time.monotonic())
        if record.state != SYNCING and (view.replaced or set(view.fenced) - set(record.fenced)):
            self._write(leadership, replace(record, view), version)
            return 0.0
        live = {member: offer for member, offer in offers.items() if member in view.live}
        order = [m for m in record.members if m in live]
        order += [self._own] if self._own in live and self._own not in order else []
        order += sorted(m for m in live if m not in order)
        accepted, rejected = admit(order, live)
        accepted += [m for m in view.kept if m not in accepted]
        turn = _Turn(leadership, record, version, accepted, rejected)
        if record.state == STABLE:
            return self._stable(turn)
        if record.state == PREPARING:
            return self._preparing(turn)
        return self._syncing(turn, live={*live, *view.kept})

    def _stable(self, turn: _Turn) -> float:
        record = turn.record
        requests = self._joined(record.generation + 1)
        if requests is None:
            return IDLE
        self._timed_out &= set(turn.accepted) - requests  # left out until it joins again
        wanted = [m for m in turn.accepted if m not in self._timed_out]
        if set(wanted) != set(record.members) or requests & set(wanted):
            state = PREPARING if wanted else STABLE
            done = record.completed if wanted else None
            new = GenerationRecord(
                record.generation + 1, state, tuple(wanted), tuple(turn.rejected), completed=done
            )
            self._commit(turn, new)
            self._new_round(record.generation + 1)
        elif set(turn.rejected) != set(record.rejected):
            self._commit(turn, dataclasses.replace(record, rejected=tuple(turn.rejected)))
        return IDLE

    def _preparing(self, turn: _Turn) -> float:
        record = turn.record
        generation = record.generation
        joined = self._joined(generation)
        if joined is None:
            return IDLE
        remaining = self._remaining(generation, PREPARING)
        self._timed_out &= set(turn.accepted) - joined
        expected = [m for m in turn.accepted if m not in self._timed_out]
        if remaining <= 0:
            if not self._store_answers_promptly():
                return IDLE
            joined |= self._join_keys(generation)  # every join written before the deadline passed
            self._timed_out.update(m for m in expected if m not in joined)
            expected = [m for m in expected if m in joined]
        if not expected:
            self._commit(turn, GenerationRecord(generation, STABLE, (), tuple(turn.rejected)))  # nobody
            return 0.0
        if all(m in joined for m in expected):
            self._sync(turn, expected)
            return 0.0
        if tuple(expected) != record.members or set(turn.rejected) != set(record.rejected):
            self._commit(
                turn, dataclasses.replace(record, members=tuple(expected), rejected=tuple(turn.rejected))
            )
        return max(0.01, min(IDLE, remaining))

    def _sync(self, turn: _Turn, expected: list[str]) -> None:
        record = turn.record
        joins: dict[str, JoinRecord] = {}
        for member in expected:
            stored = self._storage.fetch(self._layout.join(record.generation, member))
            join = JoinRecord.decode(stored.value) if stored is not None else None
            if join is None:
                raise KeyNotFoundError(f"the join of {member} vanished")
            joins[member] = join
        protocol = choose({m: [name for name, _ in join.protocols] for m, join in joins.items()})
        if protocol is None:  # joins disagree with the offers: admit again on what they joined with
            offers = {m: Offer("", tuple(name for name, _ in join.protocols)) for m, join in joins.items()}
            kept, dropped = admit(expected, offers)
            new = dataclasses.replace(record, members=tuple(kept), rejected=(*turn.rejected, *dropped))
            self._commit(turn, new)
            return
        last = record.completed.leader if record.completed else None
        leader = last if last in expected else (self._own if self._own in expected else expected[0])
        assert leader is not None
        new = dataclasses.replace(
            record,
            state=SYNCING,
            members=tuple(expected),
            rejected=tuple(turn.rejected),
            protocol=protocol,
            leader=leader,
        )
        self._commit(turn, new)
        self._new_round(record.generation, SYNCING)

    def _syncing(self, turn: _Turn, *, live: set[str]) -> float:
        record = turn.record
        assert record.leader is not None and record.protocol is not None
        remaining = self._remaining(record.generation, SYNCING)
        assignment = self._assignment_of(record.generation, record.leader)
        assigned = assignment is not None and assignment.version is not None
        left = any(member not in live for member in record.members)
        late = not left and not assigned and remaining <= 0 and self._unassigned(record)
        if left or late:
            if late:
                self._timed_out.add(record.leader)
            members = tuple(m for m in turn.accepted if m not in self._timed_out)
            new = GenerationRecord(
                record.generation + 1, PREPARING, members, tuple(turn.rejected), completed=record.completed
            )
            self._commit(turn, new)
            self._new_round(record.generation + 1)
            return 0.0
        if assignment is None or assignment.version is None:
            return max(0.05, min(IDLE, remaining))
        done = Completed(
            record.generation, record.members, record.protocol, record.leader, assignment.version
        )
        self._commit(turn, dataclasses.replace(record, state=STABLE, completed=done))
        self._clean(record.generation)
        return 0.0

    # Helpers

    def _commit(self, turn: _Turn, new: GenerationRecord) -> None:
        """Replace the record ``turn`` decided on with ``new`` (fenced, compared with its version),
        naming the static members among its members and the fenced members still live."""
        statics = {m: i for m, i in self._view.statics.items() if m in new.members}
        done, was = new.completed, turn.record.completed
        same = done is not None and was is not None and done.generation == was.generation
        aliases = turn.record.aliases if same else {}
        new = dataclasses.replace(new, statics=statics, aliases=aliases, fenced=self._view.fenced)
        self._write(turn.lead, new, turn.version)

    def _remaining(self, generation: int, state: str) -> float:
        if self._round[:2] != (generation, state):
            self._round = (generation, state, time.monotonic())
        return self._counted_from(self._round[2]) + self._timeout - time.monotonic()

    def _new_round(self, generation: int, state: str = PREPARING) -> None:
        self._round = (generation, state, time.monotonic())

    def _unassigned(self, record: GenerationRecord) -> bool:
        """Whether a prompt read shows the leader's assignment of ``record`` still missing."""
        assert record.leader is not None
        if not self._store_answers_promptly():
            return False
        return self._storage.fetch(self._layout.assignment(record.generation, record.leader)) is None

    def _join_keys(self, generation: int) -> set[str]:
        """The members whose join of ``generation`` is stored now (a linearizable read)."""
        return {key.rsplit("/", 1)[1] for key in self._storage.keys(self._layout.joins(generation))}

    def _joined(self, generation: int) -> set[str] | None:
        if self._joins is None or self._joins[0] != generation:
            if self._joins is not None:
                self._joins[1].stop()
            mirror = keyset_mirror(self._session, self._layout.joins(generation), self._thread.wake)
            mirror.start()
            self._joins = (generation, mirror)
        event = self._joins[1].event
        return None if event is None else {key.rsplit("/", 1)[1] for key in event.keys}

    def _assignment_of(self, generation: int, leader: str) -> ValueChanged | None:
        key = self._layout.assignment(generation, leader)
        if self._assignment is None or self._assignment[0] != key:
            if self._assignment is not None:
                self._assignment[1].stop()
            mirror = value_mirror(self._session, key, self._thread.wake)
            mirror.start()
            self._assignment = (key, mirror)
        return self._assignment[1].event

    def _clean(self, generation: int) -> None:
        """Remove the joins and assignments no member needs any more (best effort)."""
        storage = self._storage
        namespaces = [self._layout.joins(generation - 1), self._layout.joins(generation)]
        namespaces.append(self._layout.assignments(generation - 1))
        try:
            for namespace in namespaces:
                for key in storage.keys(namespace):
                    with contextlib.suppress(KeyNotFoundError):
                        storage.delete(key)
        except ConsensusError as exc:
            log.debug("cleaning up generation %d of %r failed (%s)", generation, self._layout.group, exc)

    def _release(self) -> None:
        for pair in (self._joins, self._assignment):
            if pair is not None:
                pair[1].stop()
        self._joins = self._assignment = None
