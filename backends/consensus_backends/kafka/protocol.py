"""Our group protocols: member metadata, the leader's assignment, and how it is computed.

Membership groups use protocol type ``consensus-group``, elections
``consensus-election``; both have one sub-protocol, ``v1``.

*Metadata* (what a member sends in JoinGroup) is a 4-byte big-endian length,
a JSON header and the member's data::

    {"id": member or candidate id, "at": join time (ms), "since": generation
     first accepted in or -1, "seen": last generation assigned or -1,
     "rank": place in the candidate queue of that generation or -1,
     "lease": [term, Kafka member id of the lease holder or null]}

*Assignment* (what the group leader gives each member) is JSON:
``{"gen", "ok": accepted, "leader": Kafka member id or null, "prev": term,
"rank": place in the candidate queue or -1}``. Both are of constant size, so
what the broker stores for a group (every member's metadata and assignment)
grows linearly with its members; an observer learns the roster from
DescribeGroups (each member's id and data from its metadata, whether it was
accepted from its assignment).

The group leader computes the assignment from the members' metadata alone:
duplicate ids are resolved in favour of the member accepted earliest (the
others are not ``ok`` and raise ``MemberExistsError``); for elections the
candidate queue keeps the order of the newest generation any member saw
(members that saw it, by their rank) and appends newcomers by join time, the
lease holder stays leader while it is a member (sticky), and ``prev`` is the
newest lease term any member has seen, which the new leader's claim must
replace.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from consensus_api.errors import ConsensusError
from consensus_backends.kafka.channel import GroupView

PROTOCOL_NAME = "v1"
GROUP_TYPE = "consensus-group"
ELECTION_TYPE = "consensus-election"
NO_RANK = -1

LeaseView = tuple[int, str | None]


@dataclass(frozen=True, slots=True)
class Metadata:
    """What one member tells the group leader."""

    id: str
    at: float
    since: int = -1
    seen: int = -1
    rank: int = NO_RANK
    lease: LeaseView = (0, None)
    data: bytes = b""


@dataclass(frozen=True, slots=True)
class Assignment:
    """The group leader's decision for one member in one generation."""

    generation: int
    accepted: bool
    leader: str | None = None
    prev: int = 0
    rank: int = NO_RANK


@dataclass(frozen=True, slots=True)
class Roster:
    """The accepted members of a group as of a Stable description (Kafka member ids as keys)."""

    ids: dict[str, str]
    data: dict[str, bytes]
    known: frozenset[str]

    @classmethod
    def of(cls, group_id: str, view: GroupView) -> Roster:
        """Read a Stable group: each member's assignment says whether it was accepted, its metadata
        names it and carries its data. ``ConsensusError`` if the group speaks another protocol."""
        if view.protocol_type not in (GROUP_TYPE, ELECTION_TYPE):
            raise ConsensusError(
                f"Kafka group {group_id!r} belongs to another protocol ({view.protocol_type})"
            )
        ids: dict[str, str] = {}
        data: dict[str, bytes] = {}
        for kid, (raw_metadata, raw_assignment) in view.members.items():
            assignment = decode_assignment(raw_assignment)
            metadata = decode_metadata(raw_metadata)
            if assignment is not None and assignment.accepted and metadata is not None:
                ids[kid] = metadata.id
                data[kid] = metadata.data
        return cls(ids, data, frozenset(view.members))

    def present(self, kafka_ids: set[str]) -> dict[str, bytes]:
        """Member id -> data of the accepted members among ``kafka_ids``."""
        return {self.ids[kid]: self.data[kid] for kid in sorted(kafka_ids) if kid in self.ids}


def encode_metadata(metadata: Metadata) -> bytes:
    """The JoinGroup metadata bytes."""
    header = json.dumps(
        {
            "id": metadata.id,
            "at": metadata.at,
            "since": metadata.since,
            "seen": metadata.seen,
            "rank": metadata.rank,
            "lease": list(metadata.lease),
        }
    ).encode()
    return struct.pack(">I", len(header)) + header + metadata.data


def decode_metadata(raw: bytes) -> Metadata | None:
    """The metadata in ``raw``, or None if it is not ours."""
    try:
        (size,) = struct.unpack_from(">I", raw)
        header: Any = json.loads(raw[4 : 4 + size])
        term, holder = header["lease"]
        return Metadata(
            id=str(header["id"]),
            at=float(header["at"]),
            since=int(header["since"]),
            seen=int(header["seen"]),
            rank=int(header["rank"]),
            lease=(int(term), None if holder is None else str(holder)),
            data=bytes(raw[4 + size :]),
        )
    except (struct.error, ValueError, KeyError, TypeError):
        return None


def encode_assignment(assignment: Assignment) -> bytes:
    """The SyncGroup assignment bytes of one member."""
    return json.dumps(
        {
            "gen": assignment.generation,
            "ok": assignment.accepted,
            "leader": assignment.leader,
            "prev": assignment.prev,
            "rank": assignment.rank,
        }
    ).encode()


def decode_assignment(raw: bytes) -> Assignment | None:
    """The assignment in ``raw``, or None if it is empty or not ours."""
    try:
        data: Any = json.loads(raw)
        leader = data["leader"]
        accepted = data["ok"]
        if not isinstance(accepted, bool):
            return None
        return Assignment(
            generation=int(data["gen"]),
            accepted=accepted,
            leader=None if leader is None else str(leader),
            prev=int(data["prev"]),
            rank=int(data["rank"]),
        )
    except (ValueError, KeyError, TypeError):
        return None


def assign(
    generation: int, members: Iterable[tuple[str, bytes]], own_lease: LeaseView, *, election: bool
) -> dict[str, bytes]:
    """Every member's assignment for ``generation`` (Kafka member id -> bytes)."""
    decoded = {kid: decode_metadata(raw) for kid, raw in members}
    valid = {kid: meta for kid, meta in decoded.items() if meta is not None}
    winners: dict[str, str] = {}
    for kid, meta in sorted(valid.items(), key=lambda item: _seniority(item[0], item[1])):
        winners.setdefault(meta.id, kid)
    accepted = set(winners.values())
    leader, term, queue = _elect(accepted, valid, own_lease) if election else (None, 0, [])
    ranks = {kid: rank for rank, kid in enumerate(queue)}
    return {
        kid: encode_assignment(Assignment(generation, kid in accepted, leader, term, ranks.get(kid, NO_RANK)))
        for kid in decoded
    }


def _seniority(kid: str, meta: Metadata) -> tuple[int, float, str]:
    return (meta.since if meta.since >= 0 else 1 << 62, meta.at, kid)


def _elect(
    accepted: set[str], valid: dict[str, Metadata], own_lease: LeaseView
) -> tuple[str | None, int, list[str]]:
    """(leader's Kafka member id, the term its claim replaces, the candidate queue)."""
    newest = max((meta.seen for meta in valid.values()), default=-1)
    previous = {kid for kid in accepted if newest >= 0 and valid[kid].seen == newest and valid[kid].rank >= 0}
    newcomers = sorted(accepted - previous, key=lambda kid: (valid[kid].at, kid))
    queue = sorted(previous, key=lambda kid: valid[kid].rank) + newcomers
    term, holder = max(
        [own_lease, *(meta.lease for meta in valid.values())], key=lambda lease: (lease[0], lease[1] is None)
    )
    leader = holder if holder in accepted else (queue[0] if queue else None)
    if leader is not None:
        queue = [leader, *(kid for kid in queue if kid != leader)]
    return leader, term, queue
