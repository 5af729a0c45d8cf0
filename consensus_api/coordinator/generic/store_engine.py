"""The generic engine: Kafka's eager rebalance protocol on storage, membership and election.

One member's side (see :mod:`records` for the layout):

1. *Register*: unless the group already has members this one shares no
   protocol with (``InconsistentGroupProtocolError``, the group untouched),
   join the membership group with its offer; the few members with the
   smallest ids stand as candidates of the group's election (others step up
   whenever nobody leads).
2. *Join* a generation (the JoinGroup): ``on_join_prepare``, then write a
   join record with the handler's metadata for the generation the arbiter is
   preparing (or the next one, which asks the arbiter for a rebalance).
3. *Assign* (the group leader only): read the members' join records and
   write ``perform_assignment``'s result for the generation.
4. *Complete* once the generation record is stable and names this member:
   read the assignment, ``on_join_complete``.

The elected candidate also runs the :class:`Arbiter` (Kafka's broker-side
group coordinator) on its own thread, so a slow callback of its member
never stalls the group. Generation fencing: a member whose generation was
passed over (the group went on without it, or its session was lost) is told
with ``on_join_prepare(-1, "")`` before it joins again, and only completes a
generation whose record names it and whose join it wrote.
"""

from __future__ import annotations

import logging
import threading
import uuid
from typing import TYPE_CHECKING

from consensus_api.coordinator.engine import CoordinatorEngine, EngineHost
from consensus_api.coordinator.generic.arbiter import Arbiter
from consensus_api.coordinator.generic.loop import Mirror, store, value_mirror
from consensus_api.coordinator.generic.negotiation import Offer, compatible
from consensus_api.coordinator.generic.records import (
    STABLE,
    SYNCING,
    AssignmentRecord,
    GenerationRecord,
    JoinRecord,
    Layout,
    decode_offer,
    encode_offer,
)
from consensus_api.coordinator.generic.seat import Seat
from consensus_api.coordinator.handler import Generation
from consensus_api.errors import FencedError, InconsistentGroupProtocolError, KeyNotFoundError
from consensus_api.membership import GroupMembership
from consensus_api.model import SessionState, ValueChanged
from consensus_api.storage import Storage

if TYPE_CHECKING:
    from consensus_api._session_port import SessionPort

log = logging.getLogger("consensus_api.coordinator")

IDLE = 1.0
RETRY = 0.5


class GenericEngine(CoordinatorEngine):
    """One member of a group on the generic protocol."""

    def __init__(
        self, session: SessionPort, group: str, protocol_type: str, host: EngineHost, rebalance_timeout: float
    ) -> None:
        self._session = session
        self._layout = layout = Layout(group)
        self._protocol_type = protocol_type
        self._host = host
        self._id = f"m-{uuid.uuid4().hex}"
        self._storage = Storage(session)
        self._membership = GroupMembership(session, layout.root)
        self._record: Mirror[ValueChanged] = value_mirror(session, layout.record, host.wake)
        arbiter = Arbiter(session, layout, self._id, rebalance_timeout)
        # A static member joins again from its thread after a session loss, once its coordinator made
        # sure that no later start of its instance took over (:mod:`..instance`), never by the session.
        rejoin = host.group_instance_id is None
        self._seat = Seat(session, layout.root, self._id, arbiter, host.wake, rejoin=rejoin)
        self._lock = threading.Lock()
        self._rejoin_requested = False
        self._held = -1  # the generation whose assignment the member holds
        self._joined = -1  # the newest generation it wrote a join record for
        self._assigned = -1  # the newest generation it computed the assignment of, as leader
        self._offer: Offer | None = None

    # CoordinatorEngine

    def member_id(self) -> str:
        return self._id

    def rebalancing(self) -> bool:
        record = self._current()
        with self._lock:
            if self._rejoin_requested:
                return True
        return record is None or record.state != STABLE or record.generation != self._held

    def request_rejoin(self) -> None:
        with self._lock:
            self._rejoin_requested = True

    def start(self) -> None:
        names = tuple(name for name, _ in self._host.protocols())
        offer = Offer(self._protocol_type, names, self._host.group_instance_id)
        others = [decode_offer(data) for member, data in self._membership.membership().items()]
        if not compatible(offer, [o if o is not None else Offer("", ()) for o in others]):
            raise InconsistentGroupProtocolError(
                f"group {self._layout.group!r} uses another protocol type or none of {list(offer.protocols)}"
            )
        self._offer = offer
        self._record.start()
        self._seat.take(self._offer_data)

    def session_state(self, state: SessionState) -> None:
        if state is SessionState.LOST:
            self._host.lost()
            self._held = self._joined = -1
            self._seat.lost()

    def step(self) -> float:
        if not self._seat.take(self._offer_data):
            return RETRY
        if self._record.event is None:
            return IDLE  # the record's first event wakes us
        record = self._current()
        if record is not None and self._id in record.rejected:
            self._host.fail(
                InconsistentGroupProtocolError(
                    f"group {self._layout.group!r} shares no protocol with this member's {self._names()}"
                )
            )
            return IDLE
        if record is not None and self._id in record.fenced:
            self._host.lost()
            self._host.fail(
                FencedError(
                    f"FENCED_INSTANCE_ID: another member of group {self._layout.group!r} started "
                    f"with group_instance_id {self._host.group_instance_id!r}"
                )
            )
            return IDLE
        if record is not None and record.generation < self._held:
            self._host.lost()  # the group's records were reset: nothing held is valid
            self._held = self._joined = -1
        self._lead_assignment(record)
        self._take_over(record)
        if self._complete(record):
            return 0.0
        target = self._join_target(record)
        if target is not None and self._joined < target:
            self._join(record, target)
        return IDLE

    def close(self, deadline: float) -> None:
        self._record.stop()
        self._seat.close()

    # The member's side of the protocol

    def _offer_data(self) -> bytes:
        assert self._offer is not None
        return encode_offer(self._offer)

    def _current(self) -> GenerationRecord | None:
        event = self._record.event
        if event is None or event.value is None:
            return None
        return GenerationRecord.decode(event.value)

    def _join_target(self, record: GenerationRecord | None) -> int | None:
        """The generation to join now, or None if the member is where it should be."""
        if record is None:
            return 1
        instance = self._host.group_instance_id
        if instance is not None and self._id not in record.members and instance in record.statics.values():
            return None  # a restarted static member: the arbiter replaces its predecessor
        with self._lock:
            rejoin = self._rejoin_requested
        done = record.completed
        if done is not None and self._id in done.members and self._joined == done.generation > self._held:
            return None  # completing that generation first
        if record.state == STABLE:
            if self._id in record.members and self._held == record.generation and not rejoin:
                return None
            return record.generation + 1
        if record.state == SYNCING and self._id not in record.members:
            return record.generation + 1
        return record.generation

    def _join(self, record: GenerationRecord | None, target: int) -> None:
        passed_over = self._held >= 0 and (record is None or target > self._held + 1)
        if passed_over:
            self._host.lost()
            self._held = -1
        protocols = self._host.rejoin()
        key = self._layout.join(target, self._id)
        store(self._storage, key, JoinRecord(tuple(protocols)).encode())
        self._joined = target
        with self._lock:
            self._rejoin_requested = False

    def _take_over(self, record: GenerationRecord | None) -> None:
        """A static member that replaced its predecessor in a stable generation completes that
        generation (with the predecessor's assignment) instead of joining a new one."""
        done = record.completed if record is not None else None
        if record is None or done is None or self._id not in record.aliases:
            return
        if record.state == STABLE and done.generation == record.generation > self._joined:
            self._host.rejoin()
            self._joined = done.generation

    def _lead_assignment(self, record: GenerationRecord | None) -> None:
        if record is None or record.state != SYNCING or record.leader != self._id:
            return
        if (
            self._assigned >= record.generation
            or record.protocol is None
            or self._joined != record.generation
        ):
            return
        storage = self._storage
        members: dict[str, bytes] = {}
        for member in record.members:
            stored = storage.fetch(self._layout.join(record.generation, member))
            join = JoinRecord.decode(stored.value) if stored is not None else None
            metadata = join.metadata(record.protocol) if join is not None else None
            if metadata is None:
                log.info("no join of %s for generation %d; the arbiter will retry", member, record.generation)
                return
            members[member] = metadata
        result = self._host.assign(self._id, record.protocol, members)
        if result is None:
            return
        key = self._layout.assignment(record.generation, self._id)
        store(self._storage, key, AssignmentRecord(record.generation, result).encode())
        self._assigned = record.generation

    def _complete(self, record: GenerationRecord | None) -> bool:
        done = record.completed if record is not None else None
        if done is None or self._id not in done.members or not self._joined == done.generation > self._held:
            return False
        stored = self._storage.fetch(self._layout.assignment(done.generation, done.leader))
        if stored is None or stored.version != done.assignment:
            return False  # a newer record is on its way
        assignment = AssignmentRecord.decode(stored.value)
        if assignment is None:
            raise KeyNotFoundError(f"the assignment of generation {done.generation} is unreadable")
        holder = record.aliases.get(self._id, self._id) if record is not None else self._id
        generation = Generation(done.generation, self._id, done.protocol)
        self._host.complete(generation, assignment.assignments.get(holder, b""))
        self._held = done.generation
        return True

    def _names(self) -> list[str]:
        return list(self._offer.protocols) if self._offer else []
