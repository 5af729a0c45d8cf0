"""Named resources spread over a group with the Coordinator, eager or cooperative (KIP-429).

:class:`ResourceHandler` is a :class:`CoordinatorHandler` (as Kafka's consumer
coordinator is an AbstractCoordinator): each assignor it is configured with
is one protocol, named like the assignor, whose metadata is the member's
subscription (resources it can take, resources it owns, from which
generation). The group uses the most preferred assignor every member supports.

* Eager (any assignor not cooperative): ``on_join_prepare`` revokes
  everything; the generation barrier guarantees nobody starts a resource
  before its previous owner stopped it. Even when the group picks a
  cooperative assignor (``["cooperative-sticky", "range"]``, the first bounce
  of KIP-429's upgrade), the member claims to own nothing, so nothing is
  withheld from its new owner.
* Cooperative (every assignor cooperative, e.g. ``cooperative-sticky``): a
  member keeps what it owns across a rebalance and only revokes what moves
  away; resources it revokes reach their new owner in the follow-up round it
  requests at once. ``on_join_prepare(-1, "")`` (membership lost) revokes all.

Listener callbacks run on the coordinator thread.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from consensus_api.assignors import Assignor, Subscription, get_assignor
from consensus_api.coordinator.handler import (
    CoordinatorHandler,
    ResourceListener,
    assignor_named,
    check_resource_listener,
    resource_names,
)
from consensus_api.coordinator.protocol_switch import POLL, incremental_holders_live
from consensus_api.errors import ConfigurationError, ConsensusError

if TYPE_CHECKING:
    from consensus_api.coordinator.core import Coordinator

#: The protocol type of resource groups.
PROTOCOL_TYPE = "resources"


class CoordinatorFactory(Protocol):
    """What ``ResourceHandler.join`` needs of a session: ``Session.coordinator``."""

    def coordinator(
        self,
        group: str,
        protocol_type: str,
        handler: CoordinatorHandler,
        *,
        rebalance_timeout: float | None = None,
        group_instance_id: str | None = None,
    ) -> Coordinator: ...


def encode_subscription(subscription: Subscription) -> bytes:
    return json.dumps(
        {
            "resources": sorted(subscription.resources),
            "owned": sorted(subscription.owned),
            "generation": subscription.generation,
            "previous": sorted(subscription.previous),
        }
    ).encode()


def decode_subscription(raw: bytes) -> Subscription:
    try:
        data: Any = json.loads(raw)
        return Subscription(
            frozenset(str(r) for r in data["resources"]),
            frozenset(str(r) for r in data["owned"]),
            int(data["generation"]),
            frozenset(str(r) for r in data.get("previous", ())),
        )
    except (ValueError, KeyError, TypeError):
        return Subscription(frozenset())


class ResourceHandler:
    """Spreads ``resources`` (this member's subscription) with ``assignors`` (most preferred first)."""

    def __init__(
        self,
        resources: Iterable[str],
        listener: ResourceListener,
        *,
        assignors: Sequence[str | Assignor] = ("cooperative-sticky",),
    ) -> None:
        self.resources = resource_names(resources)
        check_resource_listener(listener)
        self.assignors = [assignor_named(a) for a in assignors]
        if not self.assignors:
            raise ConfigurationError("a ResourceHandler needs at least one assignor")
        #: True when every assignor is cooperative: members keep what they own across rebalances.
        self.cooperative = all(a.cooperative for a in self.assignors)
        self._listener = listener
        self._owned: frozenset[str] = frozenset()
        self._last: frozenset[str] = frozenset()
        self._generation = -1
        self._coordinator: Coordinator | None = None
        self._gated = threading.Event()  # deferring to incremental members (coordinator.migration)
        self._left = threading.Event()

    def join(
        self,
        session: CoordinatorFactory,
        group: str,
        *,
        rebalance_timeout: float | None = None,
        group_instance_id: str | None = None,
    ) -> Coordinator:
        """The coordinator of this handler in ``group`` (static with a ``group_instance_id``); call
        its ``ensure_active_group`` to join."""
        self._coordinator = session.coordinator(
            group,
            PROTOCOL_TYPE,
            self,
            rebalance_timeout=rebalance_timeout,
            group_instance_id=group_instance_id,
        )
        return self._coordinator

    def update_resources(self, resources: Iterable[str]) -> None:
        """Subscribe to ``resources`` from now on: one rebalance (``Coordinator.update_metadata``).
        Cooperatively, what is owned but no longer subscribed is revoked before the rejoin."""
        self.resources = resource_names(resources)
        if self._coordinator is not None:
            self._coordinator.update_metadata()

    @property
    def owned(self) -> frozenset[str]:
        """The resources this member owns now."""
        return self._owned

    # CoordinatorHandler

    def metadata(self) -> list[tuple[str, bytes]]:
        # What it still holds (nothing, eagerly: on_join_prepare revoked it), and the last
        # assignment for stickiness only: a cooperative assignor withholds just the former.
        # A member deferring to a migrating group's incremental members subscribes to nothing.
        resources = frozenset() if self._defers() else self.resources
        subscription = encode_subscription(Subscription(resources, self._owned, self._generation, self._last))
        return [(assignor.name, subscription) for assignor in self.assignors]

    def on_join_prepare(self, generation: int, member_id: str) -> None:
        if generation < 0 or not self.cooperative:
            self._revoke(self._owned)
        self._revoke(self._owned - self.resources)  # no longer subscribed (update_resources)
        if generation < 0:
            self._generation = -1

    def perform_assignment(
        self, leader_id: str, protocol: str, members: Mapping[str, bytes]
    ) -> dict[str, bytes]:
        assignor = next((a for a in self.assignors if a.name == protocol), None) or get_assignor(protocol)
        subscriptions = {member: decode_subscription(raw) for member, raw in members.items()}
        result = assignor.assign(subscriptions)
        return {member: _encode_assignment(result.get(member, frozenset())) for member in members}

    def on_join_complete(self, generation: int, member_id: str, protocol: str, assignment: bytes) -> None:
        given = decode_assignment(assignment) & self.resources
        revoked = self._owned - given
        self._revoke(revoked)
        added = given - self._owned
        if added:
            self._owned = self._owned | added
            self._listener.on_assigned(added)
        self._last = given
        self._generation = generation
        if revoked and self.cooperative and self._coordinator is not None:
            self._coordinator.request_rejoin()  # the follow-up round hands them over

    def on_leave_prepare(self) -> None:
        self._left.set()
        self._revoke(self._owned)

    def _defers(self) -> bool:
        """True while a live incremental member of the group holds resources (checked now); then a
        thread watches for that to end and asks for a rejoin."""
        coordinator = self._coordinator
        if coordinator is None:
            return False
        try:
            defers = incremental_holders_live(coordinator.session_port, coordinator.group)
        except ConsensusError:
            defers = True  # unknown: defer, and look again
        if defers and not self._gated.is_set():
            self._gated.set()
            threading.Thread(
                target=self._await_gate,
                args=(coordinator,),
                name=f"consensus-gate-{coordinator.group}",
                daemon=True,
            ).start()
        return defers

    def _await_gate(self, coordinator: Coordinator) -> None:
        while not self._left.wait(POLL):
            try:
                if incremental_holders_live(coordinator.session_port, coordinator.group):
                    continue
            except ConsensusError:
                continue
            self._gated.clear()
            coordinator.update_metadata()
            return

    def _revoke(self, resources: frozenset[str]) -> None:
        if resources:
            self._owned = self._owned - resources
            self._listener.on_revoked(resources)


def _encode_assignment(resources: frozenset[str]) -> bytes:
    return json.dumps({"resources": sorted(resources)}).encode()


def decode_assignment(raw: bytes) -> frozenset[str]:
    try:
        data: Any = json.loads(raw)
        return frozenset(str(r) for r in data["resources"])
    except (ValueError, KeyError, TypeError):
        return frozenset()
