"""What an application implements to take part in a Coordinator's rebalances (KIP-795).

Every callback of one coordinator runs on that coordinator's own thread
(``consensus-coordinator-<group>``), one at a time and in protocol order:
never on a client library's I/O thread, never on the session's dispatcher
thread. A callback that raises is logged; the protocol goes on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class Generation:
    """One completed join: the group's generation, this member's id in it, and the chosen protocol."""

    generation_id: int
    member_id: str
    protocol_name: str


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
        """The member joined ``generation`` as ``member_id`` and received ``assignment``."""
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
