"""Assignors: how a group leader spreads named resources (tasks, partitions) over members.

An assignor maps each member's :class:`Subscription` (the resources it can
take, and what it owns now) to the resources each member gets. Every
resource in some member's subscription goes to exactly one member subscribed
to it; the result is deterministic (it depends only on the subscriptions).
Names follow Kafka's consumer assignors, and double as protocol names in
protocol negotiation (<https://consensus-api.github.io/consensus-api/spec/#8-coordinator-kip-795--the-kafka-rebalance-protocol-as-an-api>):
a member lists the assignors it supports in order of preference, the group uses the most preferred
one that every member supports.

* ``range``: resources with the same subscribers form a group; each group,
  sorted, is cut into contiguous ranges over the sorted subscribers (the first
  ones get one more).
* ``roundrobin``: resources sorted, members in a circle; each resource goes to
  the next member subscribed to it.
* ``sticky``: as balanced as ``roundrobin`` (member counts differ by at most
  one when all subscribe to everything) while moving as few resources as
  possible from their current owners.
* ``cooperative-sticky`` (KIP-429): ``sticky``, except that a resource still
  owned by another member is withheld from its new owner this round: the old
  owner revokes it, then asks for a follow-up round that hands it over. Used
  with the cooperative protocol, members keep what they own across a rebalance.

A subscription tells apart what a member *owns now* (``owned``: still running,
withheld from others by ``cooperative-sticky``) from what it was *last
assigned* (``previous``: already revoked by an eager member, used only for
stickiness). A group mixing eager and cooperative members during a rolling
upgrade (KIP-429) is thus assigned correctly: eager members own nothing while
the assignment is computed, so nothing they held is withheld.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import ClassVar

Assignment = dict[str, frozenset[str]]


@dataclass(frozen=True, slots=True)
class Subscription:
    """What one member can take, what it owns now, and what it was last assigned (``previous``,
    possibly revoked since: stickiness only), both from ``generation`` (-1 if none)."""

    resources: frozenset[str]
    owned: frozenset[str] = frozenset()
    generation: int = -1
    previous: frozenset[str] = frozenset()


class Assignor(ABC):
    """Computes an assignment from the members' subscriptions."""

    #: The assignor's name, also its protocol name in negotiation.
    name: ClassVar[str]
    #: True if it supports the cooperative protocol (never hands over a resource still owned).
    cooperative: ClassVar[bool] = False

    @abstractmethod
    def assign(self, subscriptions: Mapping[str, Subscription]) -> Assignment:
        """member id -> the resources it gets; every subscribed resource goes to one subscriber."""


class RangeAssignor(Assignor):
    """Contiguous ranges of the sorted resources, per set of subscribers."""

    name = "range"

    def assign(self, subscriptions: Mapping[str, Subscription]) -> Assignment:
        result: dict[str, set[str]] = {member: set() for member in subscriptions}
        for subscribers, resources in _by_subscribers(subscriptions).items():
            quotient, remainder = divmod(len(resources), len(subscribers))
            start = 0
            for index, member in enumerate(subscribers):
                size = quotient + (1 if index < remainder else 0)
                result[member].update(resources[start : start + size])
                start += size
        return _frozen(result)


class RoundRobinAssignor(Assignor):
    """Each sorted resource to the next subscribed member in a circle."""

    name = "roundrobin"

    def assign(self, subscriptions: Mapping[str, Subscription]) -> Assignment:
        members = sorted(subscriptions)
        result: dict[str, set[str]] = {member: set() for member in members}
        position = 0
        for resource in _universe(subscriptions):
            for step in range(len(members)):
                member = members[(position + step) % len(members)]
                if resource in subscriptions[member].resources:
                    result[member].add(resource)
                    position = (position + step + 1) % len(members)
                    break
        return _frozen(result)


class StickyAssignor(Assignor):
    """Balanced, keeping each resource with its current owner where balance allows."""

    name = "sticky"

    def assign(self, subscriptions: Mapping[str, Subscription]) -> Assignment:
        owners = current_owners(subscriptions, with_previous=True)
        kept: dict[str, list[str]] = {member: [] for member in subscriptions}
        for resource, owner in sorted(owners.items()):
            kept[owner].append(resource)
        universe = _universe(subscriptions)
        quotas = _quotas(kept, len(universe))
        result: dict[str, set[str]] = {}
        free: list[str] = []
        for member, resources in kept.items():
            result[member] = set(resources[: quotas[member]])
            free.extend(resources[quotas[member] :])
        taken = {resource for resources in result.values() for resource in resources}
        free.extend(resource for resource in universe if resource not in taken and resource not in free)
        for resource in sorted(free):
            subscribers = [m for m in sorted(subscriptions) if resource in subscriptions[m].resources]
            if not subscribers:
                continue
            room = [m for m in subscribers if len(result[m]) < quotas[m]]
            chosen = min(room or subscribers, key=lambda m: (len(result[m]), m))
            result[chosen].add(resource)
        return _frozen(result)


class CooperativeStickyAssignor(StickyAssignor):
    """``sticky``, withholding resources still owned by another member (KIP-429)."""

    name = "cooperative-sticky"
    cooperative = True

    def assign(self, subscriptions: Mapping[str, Subscription]) -> Assignment:
        target = super().assign(subscriptions)
        owners = current_owners(subscriptions)
        return {
            member: frozenset(r for r in resources if owners.get(r, member) == member)
            for member, resources in target.items()
        }


ASSIGNORS: Mapping[str, type[Assignor]] = {
    cls.name: cls for cls in (RangeAssignor, RoundRobinAssignor, StickyAssignor, CooperativeStickyAssignor)
}


def get_assignor(assignor: str | Assignor) -> Assignor:
    """The assignor named ``assignor`` (or ``assignor`` itself); ``ValueError`` for an unknown name."""
    if isinstance(assignor, Assignor):
        return assignor
    if assignor not in ASSIGNORS:
        raise ValueError(f"unknown assignor {assignor!r}; known: {', '.join(sorted(ASSIGNORS))}")
    return ASSIGNORS[assignor]()


def current_owners(
    subscriptions: Mapping[str, Subscription], *, with_previous: bool = False
) -> dict[str, str]:
    """resource -> owner: among members claiming a resource they subscribe to (owning it now, or
    also having been assigned it last if ``with_previous``), the one whose claim is from the newest
    generation (then the smallest member id) owns it."""
    owners: dict[str, tuple[int, str]] = {}
    for member in sorted(subscriptions):
        subscription = subscriptions[member]
        claimed = subscription.owned | subscription.previous if with_previous else subscription.owned
        for resource in claimed & subscription.resources:
            claim = owners.get(resource)
            if claim is None or subscription.generation > claim[0]:
                owners[resource] = (subscription.generation, member)
    return {resource: member for resource, (_, member) in owners.items()}


def _universe(subscriptions: Mapping[str, Subscription]) -> list[str]:
    return sorted({resource for s in subscriptions.values() for resource in s.resources})


def _by_subscribers(subscriptions: Mapping[str, Subscription]) -> dict[tuple[str, ...], list[str]]:
    groups: defaultdict[tuple[str, ...], list[str]] = defaultdict(list)
    for resource in _universe(subscriptions):
        subscribers = tuple(m for m in sorted(subscriptions) if resource in subscriptions[m].resources)
        groups[subscribers].append(resource)
    return dict(groups)


def _quotas(kept: Mapping[str, Iterable[str]], total: int) -> dict[str, int]:
    """floor or ceil of total / members each; the members keeping the most get the ceilings."""
    if not kept:
        return {}
    quotient, remainder = divmod(total, len(kept))
    ranked = sorted(kept, key=lambda m: (-len(list(kept[m])), m))
    return {member: quotient + (1 if index < remainder else 0) for index, member in enumerate(ranked)}


def _frozen(result: Mapping[str, set[str]]) -> Assignment:
    return {member: frozenset(resources) for member, resources in result.items()}
