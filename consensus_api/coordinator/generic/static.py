"""Static membership (KIP-345) in a generic group, as the arbiter decides it.

A static member offers an instance id (``group_instance_id``). Its member id is
new at every start, so the arbiter recognises a restart by the instance id:

* a member taking up the instance of a member of the current generation
  *replaces* it without a rebalance: it takes the old one's place in the
  record and, if the generation is stable, completes it with the old one's
  assignment (``aliases``);
* an old member still live when replaced is *fenced* (Kafka's
  ``FENCED_INSTANCE_ID``): the record names it until it is gone, and it stops;
* a static member that is gone stays in the group for ``grace`` seconds (the
  session timeout), so a restart within that time causes no rebalance; after
  it, it is removed like any member.

A new start of an instance joins only once the previous one gave up the
instance's seat (:mod:`consensus_api.coordinator.instance`): after it stopped
everything and left, or lost its session. So the arbiter normally replaces a
member that is gone; one still live here is a previous start whose departure
it has not seen yet, which has stopped already.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from consensus_api.coordinator.generic.negotiation import Offer
from consensus_api.coordinator.generic.records import STABLE, GenerationRecord


@dataclass(frozen=True, slots=True)
class StaticView:
    """What the arbiter decides on: the live members it counts (``live``), the gone static members
    still kept (``kept``), each member's instance (``statics``), fenced members still live, and the
    replacements to record now (new member -> the member it replaces)."""

    live: frozenset[str]
    kept: tuple[str, ...]
    statics: dict[str, str]
    fenced: tuple[str, ...]
    replaced: dict[str, str]


class StaticMembers:
    """The arbiter's memory of static members: since when each one is gone."""

    def __init__(self, grace: float) -> None:
        self._grace = grace
        self._gone_since: dict[str, float] = {}

    def view(self, record: GenerationRecord, offers: Mapping[str, Offer | None], now: float) -> StaticView:
        """Sort the live members (``offers``) and the record's static members as described above."""
        fenced = {m for m in record.fenced if m in offers}
        holders: dict[str, list[str]] = {}
        for member in sorted(offers):
            offer = offers[member]
            if member not in fenced and offer is not None and offer.instance is not None:
                holders.setdefault(offer.instance, []).append(member)
        incumbents = {instance: m for m, instance in record.statics.items() if m in record.members}
        replaced: dict[str, str] = {}
        for instance, members in holders.items():
            incumbent = incumbents.get(instance)
            newcomers = [m for m in members if m != incumbent]
            if not newcomers:
                continue
            chosen = newcomers[-1]
            fenced.update(m for m in members if m != chosen)
            if incumbent is not None:
                replaced[chosen] = incumbent
        gone = [
            m
            for m in record.members
            if m in record.statics and m not in offers and m not in replaced.values()
        ]
        self._gone_since = {m: self._gone_since.get(m, now) for m in gone}
        kept = tuple(m for m in gone if now - self._gone_since[m] < self._grace)
        statics = {m: o.instance for m, o in offers.items() if o is not None and o.instance is not None}
        statics.update((m, record.statics[m]) for m in kept)
        live = frozenset(m for m in offers if m not in fenced)
        return StaticView(live, kept, statics, tuple(sorted(fenced)), replaced)


def replace(record: GenerationRecord, view: StaticView) -> GenerationRecord:
    """``record`` with each replaced member swapped for its successor, which completes the stable
    generation with the assignment of the member it replaced."""
    successor = {old: new for new, old in view.replaced.items()}

    def swap(members: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(successor.get(m, m) for m in members)

    done = record.completed
    aliases = {m: a for m, a in record.aliases.items() if m not in successor}
    if record.state == STABLE and done is not None and done.generation == record.generation:
        aliases.update((new, record.aliases.get(old, old)) for new, old in view.replaced.items())
        done = dataclasses.replace(done, members=swap(done.members))
    return dataclasses.replace(
        record,
        members=swap(record.members),
        completed=done,
        aliases=aliases,
        statics={m: i for m, i in view.statics.items() if m in swap(record.members)},
        fenced=view.fenced,
    )
