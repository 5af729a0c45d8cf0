"""Our group protocols: member metadata, the leader's assignment, and how it is computed.

Membership groups use protocol type ``consensus-group``, elections
``consensus-election``; both have one sub-protocol, ``v1``.

*Metadata* (what a member sends in JoinGroup) is a 4-byte big-endian length,
a JSON header and the entries' data, concatenated::

    {"g": [group or service name, ...],
     "e": [[index into "g", id, token, since, at, data length], ...],
     "at": join time (ms), "since": generation first accepted in or -1,
     "seen": last generation assigned or -1, "rank": place in the candidate
     queue of that generation or -1, "lease": [term, Kafka member id of the
     lease holder or null]}

A session's members of *every* group are the entries of one Kafka member of
the prefix's one membership group (an entry each: its group, member id, a
token unique to that join, the generation that first accepted it or -1, its
join time); a candidate is a Kafka member of its service's election group
with one entry. A session's join adds an entry and rejoins (one rebalance of
the session-level members, not of every member), so however many groups and
members there are, the membership group has one Kafka member per session, and
what the broker stores grows by about 50 bytes per entry.

*Assignment* (what the group leader gives each member) is JSON:
``{"gen", "ok": accepted, "leader": Kafka member id or null, "prev": term,
"rank": place in the candidate queue or -1, "no": tokens of rejected
entries}``: of constant size unless entries are rejected. An observer learns
the roster from DescribeGroups (each entry's id and data from its member's
metadata, minus the entries its assignment rejected).

The group leader computes the assignment from the members' metadata alone:
duplicate ids are resolved in favour of the entry accepted earliest (the
others are rejected and raise ``MemberExistsError``); a member is ``ok`` while
one of its entries is accepted; for elections the
candidate queue keeps the order of the newest generation any member saw
(members that saw it, by their rank) and appends newcomers by join time, the
lease holder stays leader while it is a member (sticky), and ``prev`` is the
newest lease term any member has seen, which the new leader's claim must
replace.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from consensus_api.errors import ConsensusError
from consensus_backends.kafka.client import GroupView

PROTOCOL_NAME = "v1"
GROUP_TYPE = "consensus-group"
ELECTION_TYPE = "consensus-election"
NO_RANK = -1

LeaseView = tuple[int, str | None]


#: Separates a Kafka member id from an entry's token in a departure of one entry.
ENTRY_SEP = "#"


@dataclass(frozen=True, slots=True)
class Entry:
    """One member (or candidate) a Kafka member carries."""

    id: str
    token: str
    since: int = -1
    at: float = 0.0
    data: bytes = b""
    group: str = ""


@dataclass(frozen=True, slots=True)
class Metadata:
    """What one Kafka member tells the group leader."""

    entries: tuple[Entry, ...]
    at: float
    since: int = -1
    seen: int = -1
    rank: int = NO_RANK
    lease: LeaseView = (0, None)


@dataclass(frozen=True, slots=True)
class Assignment:
    """The group leader's decision for one member in one generation."""

    generation: int
    accepted: bool
    leader: str | None = None
    prev: int = 0
    rank: int = NO_RANK
    rejected: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Roster:
    """The accepted entries of a Kafka group as of a Stable description, by group name; the
    generation the description's assignments name (-1 if none does)."""

    groups: dict[str, tuple[tuple[str, Entry], ...]]  # name -> (Kafka member id, entry), by member id
    known: frozenset[str]
    generation: int = -1

    @classmethod
    def of(
        cls, group_id: str, view: GroupView, decode: Callable[[bytes], Metadata | None] | None = None
    ) -> Roster:
        """Read a Stable group: each member's metadata names its entries and carries their data, its
        assignment says which were rejected. ``decode`` (e.g. a cache) stands in for
        :func:`decode_metadata`. ``ConsensusError`` if the group speaks another protocol."""
        if view.protocol_type not in (GROUP_TYPE, ELECTION_TYPE):
            raise ConsensusError(
                f"Kafka group {group_id!r} belongs to another protocol ({view.protocol_type})"
            )
        groups: dict[str, list[tuple[str, Entry]]] = {}
        generation = -1
        for kid, (raw_metadata, raw_assignment) in sorted(view.members.items()):
            assignment = decode_assignment(raw_assignment)
            metadata = (decode or decode_metadata)(raw_metadata)
            if assignment is not None:
                generation = max(generation, assignment.generation)
            if assignment is None or not assignment.accepted or metadata is None:
                continue
            for entry in metadata.entries:
                if entry.token not in assignment.rejected:
                    groups.setdefault(entry.group, []).append((kid, entry))
        found = {name: tuple(entries) for name, entries in groups.items()}
        return cls(found, frozenset(view.members), generation)

    def older_than(self, other: Roster) -> bool:
        """Whether this roster was read from an earlier generation of the group ``other`` was read
        from: a lower generation and a Kafka member in common (a Kafka member id is never reused,
        so a group that emptied and started again at a low generation shares none)."""
        return 0 <= self.generation < other.generation and not self.known.isdisjoint(other.known)

    def present(
        self, group: str, kafka_ids: set[str], departed: frozenset[str] = frozenset()
    ) -> dict[str, bytes]:
        """Member id -> data of the accepted entries of ``group`` carried by ``kafka_ids``, minus
        ``departed``."""
        return {entry.id: entry.data for _, entry in self._live(group, kafka_ids, departed)}

    def tokens(self, group: str, kafka_ids: set[str], departed: frozenset[str]) -> frozenset[str]:
        """``<Kafka member id>#<token>`` of what :meth:`present` reports: it changes exactly when
        that answer does (an entry's data never changes)."""
        return frozenset(
            f"{kid}{ENTRY_SEP}{entry.token}" for kid, entry in self._live(group, kafka_ids, departed)
        )

    def _live(self, group: str, kafka_ids: set[str], departed: frozenset[str]) -> list[tuple[str, Entry]]:
        return [
            (kid, entry)
            for kid, entry in self.groups.get(group, ())
            if kid in kafka_ids and not (departed and f"{kid}{ENTRY_SEP}{entry.token}" in departed)
        ]


def encode_metadata(metadata: Metadata) -> bytes:
    """The JoinGroup metadata bytes."""
    groups = list(dict.fromkeys(e.group for e in metadata.entries))
    index = {group: i for i, group in enumerate(groups)}
    header = json.dumps(
        {
            "g": groups,
            "e": [[index[e.group], e.id, e.token, e.since, e.at, len(e.data)] for e in metadata.entries],
            "at": metadata.at,
            "since": metadata.since,
            "seen": metadata.seen,
            "rank": metadata.rank,
            "lease": list(metadata.lease),
        },
        separators=(",", ":"),
    ).encode()
    return struct.pack(">I", len(header)) + header + b"".join(e.data for e in metadata.entries)


def decode_metadata(raw: bytes) -> Metadata | None:
    """The metadata in ``raw``, or None if it is not ours."""
    try:
        (size,) = struct.unpack_from(">I", raw)
        header: Any = json.loads(raw[4 : 4 + size])
        term, holder = header["lease"]
        groups = [str(group) for group in header["g"]]
        offset = 4 + size
        entries = []
        for group, member_id, token, since, at, length in header["e"]:
            end = offset + int(length)
            if end > len(raw):
                return None
            data = bytes(raw[offset:end])
            entries.append(Entry(str(member_id), str(token), int(since), float(at), data, groups[group]))
            offset = end
        return Metadata(
            entries=tuple(entries),
            at=float(header["at"]),
            since=int(header["since"]),
            seen=int(header["seen"]),
            rank=int(header["rank"]),
            lease=(int(term), None if holder is None else str(holder)),
        )
    except (struct.error, ValueError, KeyError, TypeError, IndexError):
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
            "no": sorted(assignment.rejected),
        },
        separators=(",", ":"),
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
            rejected=frozenset(str(token) for token in data["no"]),
        )
    except (ValueError, KeyError, TypeError):
        return None


def assign(
    generation: int, members: Iterable[tuple[str, bytes]], own_lease: LeaseView, *, election: bool
) -> dict[str, bytes]:
    """Every member's assignment for ``generation`` (Kafka member id -> bytes)."""
    decoded = {kid: decode_metadata(raw) for kid, raw in members}
    valid = {kid: meta for kid, meta in decoded.items() if meta is not None}
    winners: dict[tuple[str, str], tuple[str, str]] = {}
    rejected: dict[str, set[str]] = {kid: set() for kid in valid}
    ranked = sorted(
        ((kid, entry) for kid, meta in valid.items() for entry in meta.entries),
        key=lambda item: _seniority(*item),
    )
    for kid, entry in ranked:
        if winners.setdefault((entry.group, entry.id), (kid, entry.token)) != (kid, entry.token):
            rejected[kid].add(entry.token)
    accepted = {kid for kid, meta in valid.items() if len(rejected[kid]) < len(meta.entries)}
    leader, term, queue = _elect(accepted, valid, own_lease) if election else (None, 0, [])
    ranks = {kid: rank for rank, kid in enumerate(queue)}
    return {
        kid: encode_assignment(
            Assignment(
                generation,
                kid in accepted,
                leader,
                term,
                ranks.get(kid, NO_RANK),
                frozenset(rejected.get(kid, ())),
            )
        )
        for kid in decoded
    }


def _seniority(kid: str, entry: Entry) -> tuple[int, float, str, str]:
    return (entry.since if entry.since >= 0 else 1 << 62, entry.at, kid, entry.token)


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
