"""KIP-848 reconciliation, as pure functions over one group state blob.

Terms: the group epoch ``G`` grows with every change of membership or
subscriptions; when ``G`` exceeds the assignment epoch ``A`` the assignor
computes a target per member (sticky from what members hold now) and ``A``
becomes ``G``. Each member has an epoch, a ``seq`` (bumped on every change of
its entry, from a group-wide clock, so an acknowledgement names what it
answers even across a member's departure and return), a state, the
resources it is ``assigned`` and those it is ``revoking``:

* ``stable``: reconciled to its epoch; when that is not ``A``, reconcile.
* ``unrevoked``: waits for the member to acknowledge (``Ack.seq >= seq``)
  that it stopped ``revoking``; then reconcile.
* ``unreleased``: some of its target is still held by others; reconcile again
  when they release.
* ``fenced``: it did not revoke within the rebalance timeout; its resources
  were freed; it comes back (epoch 0) once it acknowledges holding nothing.
  A member whose acknowledgement of the revocation is in hand when the timeout
  is judged is not fenced, however late the steward looks: it revoked.

Reconciling one member: ``keep`` = assigned ∩ target; anything else assigned
is revoked first (``unrevoked``, nothing added meanwhile); otherwise it gets
``keep`` plus the free part of its target, at epoch ``A``. A resource is free
when no other member holds it as assigned or revoking, so a resource is never
held by two members at once; a member whose assignment does not change sees
only its epoch move.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from consensus_api.assignors import Assignor, Subscription

STABLE, UNREVOKED, UNRELEASED, FENCED = "stable", "unrevoked", "unreleased", "fenced"
EMPTY: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class MemberState:
    """One member's entry in the group state."""

    epoch: int = 0
    seq: int = 0
    state: str = STABLE
    assigned: frozenset[str] = EMPTY
    revoking: frozenset[str] = EMPTY

    @property
    def held(self) -> frozenset[str]:
        return self.assigned | self.revoking


@dataclass(frozen=True, slots=True)
class Ack:
    """A member's acknowledgement: after applying its entry at ``seq``, it owns ``owned``; and the
    digest of its subscription if it changed since it joined (``update_resources``)."""

    seq: int
    owned: frozenset[str]
    subscription: str | None = None

    def encode(self) -> bytes:
        data: dict[str, Any] = {"seq": self.seq, "owned": sorted(self.owned)}
        if self.subscription is not None:
            data["subscription"] = self.subscription
        return json.dumps(data).encode()

    @staticmethod
    def decode(raw: bytes | None) -> Ack | None:
        try:
            data: Any = json.loads(raw or b"")
            subscription = data.get("subscription")
            return Ack(
                int(data["seq"]),
                frozenset(str(r) for r in data["owned"]),
                None if subscription is None else str(subscription),
            )
        except (ValueError, KeyError, TypeError, AttributeError):
            return None


@dataclass(frozen=True)
class GroupState:
    """The whole group: epochs, targets, member entries and a digest of each member's
    subscription (to notice changes; the subscriptions themselves are in the membership)."""

    group_epoch: int = 0
    assignment_epoch: int = 0
    clock: int = 0
    target: Mapping[str, frozenset[str]] = field(default_factory=dict)
    subscriptions: Mapping[str, str] = field(default_factory=dict)
    members: Mapping[str, MemberState] = field(default_factory=dict)

    def encode(self) -> bytes:
        return json.dumps(
            {
                "G": self.group_epoch,
                "A": self.assignment_epoch,
                "clock": self.clock,
                "target": {m: sorted(r) for m, r in self.target.items()},
                "subscriptions": dict(self.subscriptions),
                "members": {
                    m: [e.epoch, e.seq, e.state, sorted(e.assigned), sorted(e.revoking)]
                    for m, e in self.members.items()
                },
            },
            separators=(",", ":"),
            sort_keys=True,
        ).encode()

    @staticmethod
    def decode(raw: bytes | None) -> GroupState | None:
        try:
            data: Any = json.loads(raw or b"")
            members = {
                str(m): MemberState(int(e[0]), int(e[1]), str(e[2]), _set(e[3]), _set(e[4]))
                for m, e in data["members"].items()
            }
            return GroupState(
                int(data["G"]),
                int(data["A"]),
                int(data["clock"]),
                {str(m): _set(r) for m, r in data["target"].items()},
                {str(m): str(d) for m, d in data["subscriptions"].items()},
                members,
            )
        except (ValueError, KeyError, TypeError, IndexError, AttributeError):
            return None


def reconcile(
    state: GroupState,
    live: Mapping[str, frozenset[str]],
    acks: Mapping[str, Ack],
    expired: Collection[str],
    assignor: Assignor,
) -> GroupState:
    """The next group state: follow membership, fence ``expired`` members, recompute the target
    when the group epoch moved, then reconcile every member as far as it can go now."""
    members = dict(state.members)
    subscriptions = dict(state.subscriptions)
    clock = state.clock
    bumped = False

    def tick() -> int:
        nonlocal clock
        clock += 1
        return clock

    for member in [m for m in members if m not in live]:
        del members[member]
        subscriptions.pop(member, None)
        bumped = True
    for member, resources in sorted(live.items()):
        if member not in members:
            members[member] = MemberState(seq=tick())
            bumped = True
        if subscriptions.get(member) != (fingerprint := digest(resources)):
            subscriptions[member] = fingerprint
            bumped = True
    for member in expired:
        entry = members.get(member)
        if entry is not None and entry.state == UNREVOKED and not _revoked(entry, acks.get(member)):
            members[member] = MemberState(0, tick(), FENCED)
            bumped = True
    for member, entry in list(members.items()):
        ack = acks.get(member)
        if entry.state == FENCED and ack is not None and ack.seq >= entry.seq and not ack.owned:
            members[member] = MemberState(0, tick())
            bumped = True
    group_epoch = state.group_epoch + (1 if bumped else 0)
    target, assignment_epoch = dict(state.target), state.assignment_epoch
    if group_epoch > assignment_epoch:
        active = {m: e for m, e in members.items() if e.state != FENCED}
        subscribed = {m: Subscription(live[m], e.held, e.epoch) for m, e in active.items()}
        target = dict(assignor.assign(subscribed)) if subscribed else {}
        assignment_epoch = group_epoch
    owners = {resource: m for m, e in members.items() for resource in e.held}
    for _ in range(4):  # a release can unblock a member reconciled earlier in the same pass
        changed = False
        for member in sorted(members):
            entry = members[member]
            new = _member(
                entry,
                target.get(member, EMPTY),
                ack=acks.get(member),
                assignment_epoch=assignment_epoch,
                owners=owners,
                member=member,
            )
            if new != entry:
                new = replace(new, seq=tick())
                for resource in entry.held:
                    owners.pop(resource, None)
                owners.update(dict.fromkeys(new.held, member))
                members[member] = new
                changed = True
        if not changed:
            break
    return GroupState(group_epoch, assignment_epoch, clock, target, subscriptions, members)


def _member(
    entry: MemberState,
    target: frozenset[str],
    *,
    ack: Ack | None,
    assignment_epoch: int,
    owners: Mapping[str, str],
    member: str,
) -> MemberState:
    if entry.state == FENCED:
        return entry
    if entry.state == STABLE and entry.epoch == assignment_epoch:
        return entry
    if entry.state == UNREVOKED and not _revoked(entry, ack):
        return entry
    keep = entry.assigned & target
    revoke = entry.assigned - keep
    wanted = target - keep
    add = frozenset(r for r in wanted if owners.get(r, member) == member)
    if revoke:
        new = MemberState(entry.epoch, entry.seq, UNREVOKED, keep, revoke)
    else:
        state = UNRELEASED if wanted - add else STABLE
        new = MemberState(assignment_epoch, entry.seq, state, keep | add, EMPTY)
    return entry if new == entry else new


def _revoked(entry: MemberState, ack: Ack | None) -> bool:
    """Whether ``ack`` answers ``entry`` and owns none of what it revokes."""
    return ack is not None and ack.seq >= entry.seq and not ack.owned & entry.revoking


def digest(resources: frozenset[str]) -> str:
    """A short fingerprint of a subscription."""
    return hashlib.sha256("\n".join(sorted(resources)).encode()).hexdigest()[:24]


def _set(items: Any) -> frozenset[str]:
    return frozenset(str(item) for item in items)
