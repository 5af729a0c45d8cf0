"""Protocol negotiation as Kafka's group coordinator does it.

A group has one protocol type; each member lists protocols in order of
preference. A member may join only if its type matches and it supports at
least one protocol that every member supports. The generation's protocol is
chosen among the protocols every member supports: each member votes for the
first of those in its own list, and the most votes win (ties: the better
average rank, then the name), so unanimous preference always wins.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Offer:
    """What a member offers: its protocol type and protocol names, most preferred first, and its
    static identity (KIP-345 ``group.instance.id``) if it has one."""

    protocol_type: str
    protocols: tuple[str, ...]
    instance: str | None = None


def compatible(offer: Offer, members: Iterable[Offer]) -> bool:
    """True if ``offer`` may join a group whose members offer ``members``."""
    common: set[str] | None = None
    for member in members:
        if member.protocol_type != offer.protocol_type:
            return False
        common = set(member.protocols) if common is None else common & set(member.protocols)
    return common is None or bool(common & set(offer.protocols))


def admit(ordered: Sequence[str], offers: Mapping[str, Offer | None]) -> tuple[list[str], list[str]]:
    """Admit members in ``ordered`` order while they keep a protocol in common: (accepted, rejected).

    An unreadable offer (None) is rejected.
    """
    accepted: list[str] = []
    admitted: list[Offer] = []
    rejected: list[str] = []
    for member in ordered:
        offer = offers.get(member)
        if offer is not None and compatible(offer, admitted):
            accepted.append(member)
            admitted.append(offer)
        else:
            rejected.append(member)
    return accepted, rejected


def choose(preferences: Mapping[str, Sequence[str]]) -> str | None:
    """The protocol for members with these preferences, or None if they have none in common."""
    lists = [list(p) for p in preferences.values()]
    if not lists:
        return None
    common = set(lists[0]).intersection(*lists[1:])
    if not common:
        return None
    votes: dict[str, int] = dict.fromkeys(common, 0)
    ranks: dict[str, int] = dict.fromkeys(common, 0)
    for protocols in lists:
        ranked = [p for p in protocols if p in common]
        votes[ranked[0]] += 1
        for rank, protocol in enumerate(ranked):
            ranks[protocol] += rank
    return min(common, key=lambda p: (-votes[p], ranks[p], p))
