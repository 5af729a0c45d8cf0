"""Incremental rebalancing without a group-wide barrier (KIP-848), on every backend.

Members register their subscription (the resources they can take, stored once
per distinct set under ``subscriptions/<digest>``; the membership data holds
the digest). The member leading the group's election (a few members with the
smallest ids stand) runs the :class:`Steward`, the group coordinator. Each
member follows its own entry in the group state: it stops what it must revoke
(``on_revoked``) and acknowledges, then starts what it was given
(``on_assigned``). Nobody waits for the whole group, and:

* a resource is never owned by two members at once: it is given only once
  its previous owner acknowledged stopping it, left the group, or was fenced
  for not revoking within ``rebalance_timeout``;
* a member whose assignment does not change sees no callback;
* callbacks run on the coordinator's thread, ``consensus-coordinator-<group>``,
  one at a time; never on a client I/O thread or the session's dispatcher.

On session loss the member stops everything at once (``on_revoked``); it gets
its resources back through the steward like any joiner: a dynamic member
joins again under a new member id, with its current subscription, so nothing
its old entry held (which the steward frees once the old id is gone) is
started again from a group state read before the loss.

A static member (``group_instance_id``, KIP-345) has the member id
``i-<instance>``: restarted within the session timeout it finds its entry and
takes its resources back, nobody else disturbed. Each start claims the
instance under ``instances/<instance>``; a member that sees another claim is
fenced: it stops everything (``on_revoked``), leaves, and its
``ensure_active_group`` raises ``FencedError``. ``update_resources`` changes
the subscription: one new group epoch.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Iterable
from typing import TYPE_CHECKING

from consensus_api.assignors import Assignor
from consensus_api.coordinator.generic.loop import Mirror, store, value_mirror
from consensus_api.coordinator.generic.reconcile import FENCED, STABLE, Ack, GroupState, MemberState
from consensus_api.coordinator.generic.records import IncrementalLayout
from consensus_api.coordinator.generic.seat import Seat
from consensus_api.coordinator.generic.steward import Steward, publish_subscription, static_member_id
from consensus_api.coordinator.handler import (
    ResourceListener,
    assignor_named,
    check_resource_listener,
    resource_names,
)
from consensus_api.coordinator.member import GroupMember
from consensus_api.coordinator.protocol_switch import Gate, classic_members_live
from consensus_api.errors import FencedError
from consensus_api.keys import check_segment
from consensus_api.model import SessionState, ValueChanged
from consensus_api.storage import Storage

if TYPE_CHECKING:
    from consensus_api._session_port import SessionPort

log = logging.getLogger("consensus_api.coordinator")

IDLE = 1.0
RETRY = 0.5


class IncrementalCoordinator(GroupMember):
    """A member of an incremental group; see ``session.incremental_coordinator``. ``close`` stops
    everything owned (``on_revoked``), then leaves the group."""

    def __init__(
        self,
        session: SessionPort,
        group: str,
        resources: Iterable[str],
        listener: ResourceListener,
        *,
        assignor: str | Assignor = "sticky",
        rebalance_timeout: float | None = None,
        group_instance_id: str | None = None,
    ) -> None:
        super().__init__(session, group, rebalance_timeout)
        self._storage = Storage(session)
        self.resources = resource_names(resources)
        self._instance = (
            None if group_instance_id is None else check_segment(group_instance_id, "instance id")
        )
        check_resource_listener(listener)
        chosen = assignor_named(assignor)
        self._listener = listener
        self._layout = layout = IncrementalLayout(self.group)
        self._id = _dynamic_id() if self._instance is None else static_member_id(self._instance)
        self._incarnation = uuid.uuid4().hex
        self._claim: Mirror[ValueChanged] | None = None
        if self._instance is not None:
            self._claim = value_mirror(session, layout.instance(self._instance), self._thread.wake)
        self._subscription: str | None = None  # the digest of an updated subscription
        self._resubscribe = False
        self._gate: Gate | None = None  # deferring to a migrating group's classic members
        self._owned: frozenset[str] = frozenset()
        self._entry: MemberState | None = None
        self._reconciled = False
        self._acked: Ack | None = None
        self._state: Mirror[ValueChanged] = value_mirror(session, layout.state, self._thread.wake)
        steward = Steward(session, layout, chosen, self.rebalance_timeout)
        rejoin = self._instance is not None  # a static member keeps its id and entry across a loss
        self._seat = Seat(session, layout.root, self._id, steward, self._thread.wake, rejoin=rejoin)
        session.add_state_listener(self._on_state)

    # The public interface

    def ensure_active_group(self, timeout: float | None = None) -> int:
        """Join if not yet joined, then wait until this member is reconciled with the group's
        current target; returns its member epoch. ``OperationTimeoutError`` after ``timeout``
        (default: ``rebalance_timeout`` plus the session's ``request_timeout``), ``SessionLostError``
        once closed."""
        return self._await(self._reconciled_epoch, timeout, "reconcile")

    def member_id(self) -> str:
        """This member's id in the group."""
        return self._id

    def epoch(self) -> int | None:
        """This member's epoch (the group epoch it last reconciled to), or None before it has one."""
        with self._cond:
            return self._entry.epoch if self._entry is not None else None

    def assignment(self) -> frozenset[str]:
        """The resources this member owns now."""
        with self._cond:
            return self._owned

    def update_resources(self, resources: Iterable[str]) -> None:
        """Subscribe to ``resources`` from now on (one new group epoch). Returns at once."""
        checked = resource_names(resources)
        with self._cond:
            self.resources, self._resubscribe = checked, True
        self._thread.wake()

    def __repr__(self) -> str:
        return f"<IncrementalCoordinator {self.group!r} {self._id} owns {len(self._owned)}>"

    # The coordinator thread

    def _step(self) -> float:
        for change in self._take_states():
            if change is SessionState.LOST:
                self._set_owned(frozenset(), lost=True)
                self._acked = None
                if self._instance is None:
                    with self._cond:
                        self._id, self._entry, self._reconciled = _dynamic_id(), None, False
                    self._seat.lost(self._id)
                else:
                    self._seat.lost()
        if self._fenced():
            return IDLE
        if not self._seat.take(self._subscribe):
            return RETRY
        gate = self._gate
        if gate is not None and gate.due() and gate.set(classic_members_live(self._session, self.group)):
            with self._cond:
                self._resubscribe = True  # the classic members are gone: take part
        self._publish_update()
        state = _decoded(self._state.event)
        entry = state.members.get(self._id) if state is not None else None
        if entry is None:
            self._set_owned(frozenset(), lost=True)  # not admitted yet, or dropped from the group
        elif entry.state == FENCED:
            self._set_owned(frozenset(), lost=True)
        else:
            self._set_owned(entry.assigned)
        if entry is not None:
            self._acknowledge(entry)
        with self._cond:
            self._entry = entry
            self._reconciled = (
                entry is not None
                and state is not None
                and entry.state == STABLE
                and entry.epoch == state.assignment_epoch
            )
            self._cond.notify_all()
        return IDLE

    def _reconciled_epoch(self) -> int | None:
        return self._entry.epoch if self._reconciled and self._entry is not None else None

    def _subscribe(self) -> bytes:
        """Claim the instance (static members), follow the group state and publish the
        subscription; the membership data naming it."""
        if self._claim is not None and self._instance is not None:
            store(self._storage, self._layout.instance(self._instance), self._incarnation.encode())
            self._claim.start()
        self._state.start()
        if self._gate is None:  # the first join only: a member that took part never defers again
            self._gate = Gate()
            self._gate.set(classic_members_live(self._session, self.group))
        resources = frozenset() if self._gate.closed else self.resources
        return publish_subscription(self._storage, self._layout, resources)

    def _fenced(self) -> bool:
        """True (and the member stopped, told) once another start of this instance claimed it."""
        event = self._claim.event if self._claim is not None else None
        if event is None or event.value in (None, self._incarnation.encode()):
            return False
        self._set_owned(frozenset(), lost=True)
        with self._cond:
            self._error = FencedError(
                f"FENCED_INSTANCE_ID: another member of incremental group {self.group!r} started "
                f"with group_instance_id {self._instance!r}"
            )
            self._cond.notify_all()
        self._thread.stop(0)
        return True

    def _publish_update(self) -> None:
        """After ``update_resources``: store the new subscription, name it in an acknowledgement."""
        with self._cond:
            resubscribe, self._resubscribe = self._resubscribe, False
            resources = self.resources
        if not resubscribe:
            return
        self._subscription = publish_subscription(self._storage, self._layout, resources).decode()
        last = self._acked
        with self._cond:
            owned = self._owned
        ack = Ack(last.seq if last is not None else 0, owned, self._subscription)
        store(self._storage, self._layout.ack(self._id), ack.encode())
        self._acked = ack

    def _set_owned(self, wanted: frozenset[str], *, lost: bool = False) -> None:
        """Stop what is owned but not wanted, then start what is wanted but not owned."""
        with self._cond:
            owned = self._owned
        revoked, added = owned - wanted, wanted - owned
        if revoked:
            self._call("on_revoked", revoked)
            with self._cond:
                self._owned = owned = owned - revoked
        if added and not lost:
            self._call("on_assigned", added)
            with self._cond:
                self._owned = owned | added

    def _acknowledge(self, entry: MemberState) -> None:
        with self._cond:
            owned = self._owned
        last = self._acked
        if last is not None and last.seq >= entry.seq:
            return
        if last is not None and last.owned == owned and not entry.revoking and entry.state != FENCED:
            return  # nothing the steward waits for
        ack = Ack(entry.seq, owned, self._subscription)
        store(self._storage, self._layout.ack(self._id), ack.encode())
        self._acked = ack

    def _finish(self) -> None:
        self._set_owned(frozenset(), lost=True)
        if self._claim is not None:
            self._claim.stop()
        self._state.stop()
        self._seat.close()

    def _call(self, name: str, resources: frozenset[str]) -> None:
        try:
            getattr(self._listener, name)(resources)
        except Exception:
            log.exception("%s of incremental group %r raised; going on", name, self.group)


def _dynamic_id() -> str:
    return f"m-{uuid.uuid4().hex}"


_cache_lock = threading.Lock()
_cache: dict[tuple[str, bytes], GroupState | None] = {}


def _decoded(event: ValueChanged | None) -> GroupState | None:
    """The group state in ``event``, decoded once for all the members of this process."""
    if event is None or event.value is None:
        return None
    key = (event.key, event.value)
    with _cache_lock:
        if key in _cache:
            return _cache[key]
    state = GroupState.decode(event.value)
    with _cache_lock:
        if len(_cache) >= 64:
            _cache.clear()
        _cache[key] = state
    return state
