"""What a coordinated group looks like now: the data of ``session.describe_group`` and
``consensus group describe``, as ``kafka-consumer-groups --describe`` shows a consumer group.

Data only, importing nothing of the library: the backend interface names it
(``Backend.describe_coordinator_group``) without depending on the coordinator,
and :mod:`.describe` reads it from the generic engines' records.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class MemberDescription:
    """One member: its id, static instance id, generation (or member epoch), and assignment:
    ``resources`` for a resource group, else the raw bytes (``assignment``)."""

    member_id: str
    instance_id: str | None = None
    epoch: int | None = None
    resources: tuple[str, ...] | None = None
    assignment: bytes | None = None


@dataclass(frozen=True, slots=True)
class GroupDescription:
    """A group: ``mode`` (eager, cooperative, classic for a handler of its own, incremental, or
    empty), ``state``, ``generation`` (the generation id, or the incremental group epoch; None when
    the backend does not tell), the chosen ``protocol``, the protocol type, and its members."""

    group: str
    mode: str
    state: str
    generation: int | None = None
    protocol: str | None = None
    protocol_type: str | None = None
    members: tuple[MemberDescription, ...] = ()

    def as_json(self) -> dict[str, Any]:
        """A JSON-able dict (assignments that are not resource lists as hex)."""
        return {
            "group": self.group,
            "mode": self.mode,
            "state": self.state,
            "generation": self.generation,
            "protocol": self.protocol,
            "protocol_type": self.protocol_type,
            "members": [
                {
                    "member": m.member_id,
                    "instance": m.instance_id,
                    "epoch": m.epoch,
                    "resources": None if m.resources is None else list(m.resources),
                    "assignment": None if m.assignment is None else m.assignment.hex(),
                }
                for m in self.members
            ],
        }
