"""What an application implements to take part in a Coordinator's rebalances (KIP-795).

Every callback of one coordinator runs on that coordinator's own thread
(``consensus-coordinator-<group>``), one at a time and in protocol order:
never on a client library's I/O thread, never on the session's dispatcher
thread. A callback that raises is logged; the protocol goes on, except for
``on_join_complete``, which is called again (same arguments) until it returns.

The checks at the end turn what an application passes in (handlers,
listeners, resource names, assignors) into ``ConsensusError`` subclasses
before any I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from consensus_api.assignors import Assignor, get_assignor
from consensus_api.errors import ConfigurationError, InvalidTypeError
from consensus_api.keys import check_segment


@dataclass(frozen=True, slots=True)
class Generation:
    """One completed join: the group's generation, this member's id in it, and the chosen protocol."""

    generation_id: int
    member_id: str
    protocol_name: str

    def has_member_id(self) -> bool:
        """True if the group gave the member an id (Kafka's ``Generation.hasMemberId``)."""
        return self.member_id != ""


#: The generation of a member that holds none (Kafka's ``Generation.NO_GENERATION``).
NO_GENERATION = Generation(-1, "", "")


class CoordinatorHandler(Protocol):
    """The five callbacks of Kafka's AbstractCoordinator, as a protocol class."""

    def metadata(self) -> Sequence[tuple[str, bytes]]:
        """The protocols this member supports, most preferred first, each with its metadata.

        Called before every join (after ``on_join_prepare``), so the metadata may change.
        """
        ...

    def on_join_prepare(self, generation: int, member_id: str) -> None:
        """A (re)join starts. ``generation`` and ``member_id`` are those of the assignment still
        held; ``(-1, "")`` on the first join and when the membership was lost (session loss,
        fenced out of a generation): whatever the member held must be dropped now."""
        ...

    def perform_assignment(
        self, leader_id: str, protocol: str, members: Mapping[str, bytes]
    ) -> Mapping[str, bytes]:
        """On the generation's leader only: ``members`` maps every member id to its metadata for
        ``protocol``; return the assignment of each (missing members get ``b""``)."""
        ...

    def on_join_complete(self, generation: int, member_id: str, protocol: str, assignment: bytes) -> None:
        """The member joined ``generation`` as ``member_id`` and received ``assignment``. If it
        raises, it is called again with the same arguments (backing off) until it returns, before
        anything else happens; the generation is not stable until then."""
        ...

    def on_leave_prepare(self) -> None:
        """The member is about to leave the group (``close``)."""
        ...


class ResourceListener(Protocol):
    """Told when this member starts and stops owning resources."""

    def on_assigned(self, resources: frozenset[str]) -> None:
        """This member owns ``resources`` from now on (start them)."""
        ...

    def on_revoked(self, resources: frozenset[str]) -> None:
        """This member no longer owns ``resources`` (stop them before returning)."""
        ...


def require_callbacks(obj: object, names: Sequence[str], role: str, protocol: str) -> None:
    """``InvalidTypeError`` naming every one of ``names`` that ``obj`` lacks as a callable."""
    missing = [name for name in names if not callable(getattr(obj, name, None))]
    if missing:
        raise InvalidTypeError(f"the {role} lacks {', '.join(missing)} (see {protocol})")


def resource_names(resources: Iterable[str]) -> frozenset[str]:
    """``resources`` as a set of checked names, each one key segment."""
    if isinstance(resources, str):
        raise InvalidTypeError("resources must be an iterable of names, not one str")
    return frozenset(check_segment(r, "resource name") for r in resources)


def check_resource_listener(listener: object) -> None:
    """``InvalidTypeError`` unless ``listener`` has both callbacks of a :class:`ResourceListener`
    (plain or ``async def``: what is passed in is checked, whatever its declared type)."""
    require_callbacks(listener, ("on_assigned", "on_revoked"), "listener", "ResourceListener")


def assignor_named(assignor: str | Assignor) -> Assignor:
    """The assignor ``assignor`` names (or is); ``ConfigurationError`` for an unknown name."""
    try:
        return get_assignor(assignor)
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None
