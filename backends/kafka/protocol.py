"""Our group protocols: member metadata, the leader's assignment, and how it is computed.

Membership groups use protocol type ``consensus-group``, elections
``consensus-election``; both have one sub-protocol, ``v1``.

*Metadata* (what a member sends in JoinGroup) is a 4-byte big-endian length,
a JSON header and the member's data::

    {"id": member or candidate id, "at": join time (ms), "since": generation
     first accepted in or -1, "seen": last generation assigned or -1,
     "queue": [Kafka member ids, the candidate queue of that generation],
     "lease": [term, Kafka member id of the lease holder or null]}

*Assignment* (what the group leader gives every member, the same for all) is
JSON: ``{"gen", "members": {Kafka member id: id}, "rejected": [...],
"queue": [...], "leader": Kafka member id or null, "prev": term}``. The group
leader computes it from the members' metadata alone: duplicate ids are
resolved in favour of the member accepted earliest (the others are
``rejected`` and raise ``MemberExistsError``); for elections the candidate
queue keeps the previous generation's order and appends newcomers by join
time, the lease holder stays leader while it is a member (sticky), and
``prev`` is the newest lease term any member has seen, which the new leader's
claim must replace.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

PROTOCOL_NAME = "v1"
GROUP_TYPE = "consensus-group"
ELECTION_TYPE = "consensus-election"

LeaseView = tuple[int, str | None]


@dataclass(frozen=True, slots=True)
class Metadata:
    """What one member tells the group leader."""

    id: str
    at: float
    since: int = -1
    seen: int = -1
    queue: tuple[str, ...] = ()
    lease: LeaseView = (0, None)
    data: bytes = b""


@dataclass(frozen=True, slots=True)
class Assignment:
    """The group leader's decision for one generation, sent to every member."""

    generation: int
    members: dict[str, str]
    rejected: tuple[str, ...] = ()
    queue: tuple[str, ...] = ()
    leader: str | None = None
    prev: int = 0


def encode_metadata(metadata: Metadata) -> bytes:
    """The JoinGroup metadata bytes."""
    header = json.dumps(
        {
            "id": metadata.id,
            "at": metadata.at,
            "since": metadata.since,
            "seen": metadata.seen,
            "queue": list(metadata.queue),
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
            queue=tuple(str(k) for k in header["queue"]),
            lease=(int(term), None if holder is None else str(holder)),
            data=bytes(raw[4 + size :]),
        )
    except (struct.error, ValueError, KeyError, TypeError):
        return None


def encode_assignment(assignment: Assignment) -> bytes:
    """The SyncGroup assignment bytes."""
    return json.dumps(
        {
            "gen": assignment.generation,
            "members": assignment.members,
            "rejected": list(assignment.rejected),
            "queue": list(assignment.queue),
            "leader": assignment.leader,
            "prev": assignment.prev,
        }
    ).encode()


def decode_assignment(raw: bytes) -> Assignment | None:
    """The assignment in ``raw``, or None if it is empty or not ours."""
    try:
        data: Any = json.loads(raw)
        leader = data["leader"]
        return Assignment(
            generation=int(data["gen"]),
            members={str(k): str(v) for k, v in data["members"].items()},
            rejected=tuple(str(k) for k in data["rejected"]),
            queue=tuple(str(k) for k in data["queue"]),
            leader=None if leader is None else str(leader),
            prev=int(data["prev"]),
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def assign(
    generation: int, members: Iterable[tuple[str, bytes]], own_lease: LeaseView, *, election: bool
) -> dict[str, bytes]:
    """The assignment of every member (all get the same bytes) for ``generation``."""
    decoded = {kid: decode_metadata(raw) for kid, raw in members}
    valid = {kid: meta for kid, meta in decoded.items() if meta is not None}
    winners: dict[str, str] = {}
    for kid, meta in sorted(valid.items(), key=lambda item: _seniority(item[0], item[1])):
        winners.setdefault(meta.id, kid)
    accepted = {kid: valid[kid].id for kid in winners.values()}
    rejected = tuple(sorted(kid for kid in decoded if kid not in accepted))
    assignment = Assignment(generation, accepted, rejected)
    if election:
        assignment = _elect(assignment, valid, own_lease)
    payload = encode_assignment(assignment)
    return dict.fromkeys(decoded, payload)


def _seniority(kid: str, meta: Metadata) -> tuple[int, float, str]:
    return (meta.since if meta.since >= 0 else 1 << 62, meta.at, kid)


def _elect(assignment: Assignment, valid: dict[str, Metadata], own_lease: LeaseView) -> Assignment:
    accepted = assignment.members
    history = max(valid.values(), key=lambda meta: meta.seen, default=None)
    previous = [kid for kid in (history.queue if history else ()) if kid in accepted]
    newcomers = sorted((kid for kid in accepted if kid not in previous), key=lambda k: (valid[k].at, k))
    queue = previous + newcomers
    term, holder = max(
        [own_lease, *(meta.lease for meta in valid.values())], key=lambda lease: (lease[0], lease[1] is None)
    )
    leader = holder if holder in accepted else (queue[0] if queue else None)
    if leader is not None:
        queue = [leader, *(kid for kid in queue if kid != leader)]
    return Assignment(assignment.generation, accepted, assignment.rejected, tuple(queue), leader, term)
