"""Value types and events shared by every backend: immutable and hashable."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType


class SessionState(enum.Enum):
    """Liveness of a session (<https://consensus-api.github.io/consensus-api/spec/#3-session>)."""

    CONNECTED = "connected"
    SUSPENDED = "suspended"
    LOST = "lost"
    CLOSED = "closed"


@dataclass(frozen=True, slots=True)
class Versioned:
    """A stored value and its version; versions strictly increase per key."""

    value: bytes
    version: int


@dataclass(frozen=True, slots=True)
class Leadership:
    """One leader's tenure; ``term`` is the fencing token and strictly increases."""

    service: str
    leader_id: str
    term: int


@dataclass(frozen=True, slots=True)
class ValueChanged:
    """The current value of ``key``; ``value`` and ``version`` are None once deleted."""

    key: str
    value: bytes | None
    version: int | None


@dataclass(frozen=True, slots=True)
class KeySetChanged:
    """The keys exactly one level below ``namespace``."""

    namespace: str
    keys: frozenset[str]


@dataclass(frozen=True, slots=True)
class MembershipChanged:
    """The live members of ``group`` with their data."""

    group: str
    members: Mapping[str, bytes]

    def __hash__(self) -> int:
        return hash((self.group, frozenset(self.members.items())))


@dataclass(frozen=True, slots=True)
class LeaderChanged:
    """The leader of ``service``; both fields are None while nobody leads."""

    service: str
    leader_id: str | None
    term: int | None


Event = ValueChanged | KeySetChanged | MembershipChanged | LeaderChanged


def frozen_members(members: Mapping[str, bytes]) -> Mapping[str, bytes]:
    """A read-only copy of a membership mapping."""
    return MappingProxyType(dict(members))
