"""Where generic and incremental groups are kept, and the JSON records the generic engine writes.

Layout for group ``g`` (``<s>`` is ``g`` as one key segment: ``%`` and ``/``
percent-encoded, or a digest when too long)::

    membership group  _coordinator/<s>               member id -> Offer (protocol type, names)
    election          _coordinator/<s>               candidates: the member ids; the leader arbitrates
    key               _coordinator/<s>/generation    GenerationRecord (written by the arbiter, fenced)
    keys              _coordinator/<s>/joins/<n>/<m> JoinRecord: member m joins generation n (member)
    keys              _coordinator/<s>/assign/<n>/<l> AssignmentRecord of generation n by leader l (member l)
    membership group  _static/<s>                    instance -> the start holding it (:mod:`..instance`)
    keys              _static/<s>/<instance>         the instance's latest start (its claim)

(The instances' seats are a group of their own, not one under ``_coordinator/<s>``: a group's
name is not a prefix of another's.)

An incremental group lives under ``_incremental/<s>`` (:class:`IncrementalLayout`): its
membership group and election, the steward's ``state``, each member's ``owned/<m>``
acknowledgement and ``subscriptions/<digest>``.

A malformed record decodes to None and is treated as absent.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from consensus_api.coordinator.generic.negotiation import Offer

PREPARING, SYNCING, STABLE = "preparing", "syncing", "stable"
MAX_SEGMENT = 200


def group_segment(group: str) -> str:
    """``group`` as one key segment that no other group name maps to."""
    escaped = group.replace("%", "%25").replace("/", "%2F")
    if len(escaped) <= MAX_SEGMENT:
        return escaped
    return "%" + hashlib.sha256(group.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Layout:
    """The names the generic engine uses for one group under ``base``."""

    group: str
    base: str = "_coordinator"

    @property
    def root(self) -> str:
        """The membership group, the election service and the key namespace."""
        return f"{self.base}/{group_segment(self.group)}"

    @property
    def record(self) -> str:
        return f"{self.root}/generation"

    def joins(self, generation: int) -> str:
        return f"{self.root}/joins/{generation}"

    def join(self, generation: int, member: str) -> str:
        return f"{self.joins(generation)}/{member}"

    def assignments(self, generation: int) -> str:
        return f"{self.root}/assign/{generation}"

    def assignment(self, generation: int, leader: str) -> str:
        return f"{self.assignments(generation)}/{leader}"

    @property
    def instances(self) -> str:
        """The membership group of the static members' seats, one member per instance held."""
        return f"_static/{group_segment(self.group)}"

    def instance(self, instance: str) -> str:
        """The claim of a static member's instance: the start that claimed it last."""
        return f"{self.instances}/{instance}"


def encode_offer(offer: Offer) -> bytes:
    """Membership data: the protocol type and names a member offers."""
    data: dict[str, Any] = {"type": offer.protocol_type, "protocols": list(offer.protocols)}
    if offer.instance is not None:
        data["instance"] = offer.instance
    return _dump(data)


def decode_offer(raw: bytes) -> Offer | None:
    data = _load(raw)
    try:
        instance = _optional(data.get("instance"), str)
        return Offer(str(data["type"]), tuple(str(p) for p in data["protocols"]), instance)
    except (KeyError, TypeError):
        return None


@dataclass(frozen=True, slots=True)
class JoinRecord:
    """A member's request to join one generation, with its protocols' metadata."""

    protocols: tuple[tuple[str, bytes], ...]

    def metadata(self, protocol: str) -> bytes | None:
        return next((meta for name, meta in self.protocols if name == protocol), None)

    def encode(self) -> bytes:
        return _dump({"protocols": [[name, _b64(meta)] for name, meta in self.protocols]})

    @staticmethod
    def decode(raw: bytes) -> JoinRecord | None:
        data = _load(raw)
        try:
            return JoinRecord(tuple((str(name), _unb64(meta)) for name, meta in data["protocols"]))
        except (KeyError, TypeError, ValueError):
            return None


@dataclass(frozen=True, slots=True)
class Completed:
    """A generation whose assignment is out: its members, protocol, leader and assignment version."""

    generation: int
    members: tuple[str, ...]
    protocol: str
    leader: str
    assignment: int


@dataclass(frozen=True, slots=True)
class GenerationRecord:
    """The group's current generation as the arbiter decided it.

    ``preparing``: members are joining (``members`` = those awaited);
    ``syncing``: ``leader`` computes the assignment for ``members`` with ``protocol``;
    ``stable``: the assignment is out. ``completed`` is the newest generation whose
    assignment is out (this one when stable), so a member that joined it completes
    it even after the next rebalance began.

    Static membership (KIP-345): ``statics`` maps each static member to its
    instance id; ``aliases`` maps a static member that replaced an earlier one
    of its instance to the member id its completed assignment is stored under;
    ``fenced`` names members replaced while still live (they stop, told).
    """

    generation: int
    state: str
    members: tuple[str, ...] = ()
    rejected: tuple[str, ...] = ()
    protocol: str | None = None
    leader: str | None = None
    completed: Completed | None = None
    statics: dict[str, str] = field(default_factory=dict)
    aliases: dict[str, str] = field(default_factory=dict)
    fenced: tuple[str, ...] = ()

    def encode(self) -> bytes:
        done = self.completed
        return _dump(
            {
                "generation": self.generation,
                "state": self.state,
                "members": list(self.members),
                "rejected": list(self.rejected),
                "protocol": self.protocol,
                "leader": self.leader,
                "completed": None
                if done is None
                else [done.generation, list(done.members), done.protocol, done.leader, done.assignment],
                "statics": self.statics,
                "aliases": self.aliases,
                "fenced": list(self.fenced),
            }
        )

    @staticmethod
    def decode(raw: bytes) -> GenerationRecord | None:
        data = _load(raw)
        try:
            state = str(data["state"])
            if state not in (PREPARING, SYNCING, STABLE):
                return None
            done = data["completed"]
            completed = (
                None
                if done is None
                else Completed(
                    int(done[0]), tuple(str(m) for m in done[1]), str(done[2]), str(done[3]), int(done[4])
                )
            )
            return GenerationRecord(
                generation=int(data["generation"]),
                state=state,
                members=tuple(str(m) for m in data["members"]),
                rejected=tuple(str(m) for m in data["rejected"]),
                protocol=_optional(data["protocol"], str),
                leader=_optional(data["leader"], str),
                completed=completed,
                statics={str(m): str(i) for m, i in data.get("statics", {}).items()},
                aliases={str(m): str(a) for m, a in data.get("aliases", {}).items()},
                fenced=tuple(str(m) for m in data.get("fenced", ())),
            )
        except (KeyError, TypeError, ValueError, IndexError, AttributeError):
            return None


@dataclass(frozen=True, slots=True)
class AssignmentRecord:
    """The leader's assignment of one generation: member id -> bytes."""

    generation: int
    assignments: dict[str, bytes] = field(default_factory=dict)

    def encode(self) -> bytes:
        return _dump(
            {"generation": self.generation, "assignments": {m: _b64(a) for m, a in self.assignments.items()}}
        )

    @staticmethod
    def decode(raw: bytes) -> AssignmentRecord | None:
        data = _load(raw)
        try:
            assignments = {str(m): _unb64(a) for m, a in data["assignments"].items()}
            return AssignmentRecord(int(data["generation"]), assignments)
        except (KeyError, TypeError, ValueError, AttributeError):
            return None


def _dump(data: Any) -> bytes:
    return json.dumps(data, separators=(",", ":"), sort_keys=True).encode()


def _load(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return None


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: Any) -> bytes:
    if not isinstance(text, str):
        raise TypeError("expected base64 text")
    return base64.b64decode(text, validate=True)


def _optional(value: Any, kind: type[Any]) -> Any:
    return None if value is None else kind(value)


@dataclass(frozen=True, slots=True)
class IncrementalLayout:
    """Names of one incremental group: membership, election, state blob and acknowledgements."""

    group: str

    @property
    def root(self) -> str:
        return f"_incremental/{group_segment(self.group)}"

    @property
    def state(self) -> str:
        return f"{self.root}/state"

    def ack(self, member: str) -> str:
        return f"{self.root}/owned/{member}"

    def subscription(self, digest: str) -> str:
        return f"{self.root}/subscriptions/{digest}"

    def instance(self, instance: str) -> str:
        """The claim of a static member's instance: the incarnation that started last."""
        return f"{self.root}/instances/{instance}"
