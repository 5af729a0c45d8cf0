"""Reading what a coordinated group looks like now (``session.describe_group``, ``consensus group
describe``) into a :class:`~.description.GroupDescription`.

A backend with its own engine describes its groups itself
(``Backend.describe_coordinator_group``: Kafka asks the broker); otherwise,
and for incremental groups everywhere, the description is read from the
generic engines' records. A read-only snapshot: it never joins the group.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from consensus_api.assignors import ASSIGNORS
from consensus_api.coordinator.description import GroupDescription, MemberDescription
from consensus_api.coordinator.generic.reconcile import STABLE as RECONCILED
from consensus_api.coordinator.generic.reconcile import GroupState
from consensus_api.coordinator.generic.records import (
    AssignmentRecord,
    GenerationRecord,
    IncrementalLayout,
    Layout,
    decode_offer,
)
from consensus_api.coordinator.generic.steward import is_static
from consensus_api.coordinator.resources import PROTOCOL_TYPE, decode_assignment
from consensus_api.keys import check_key

if TYPE_CHECKING:
    from consensus_api._session_port import SessionPort


def classic_mode(protocol_type: str | None, protocol: str | None) -> str:
    """eager or cooperative for a resource group (by its assignor), classic otherwise."""
    if protocol_type != PROTOCOL_TYPE or protocol is None:
        return "classic"
    assignor = ASSIGNORS.get(protocol)
    return "cooperative" if assignor is not None and assignor.cooperative else "eager"


def member(
    member_id: str, protocol_type: str | None, assignment: bytes | None, **fields: Any
) -> MemberDescription:
    """A member, its assignment decoded to resources in a resource group."""
    if protocol_type == PROTOCOL_TYPE and assignment is not None:
        return MemberDescription(member_id, resources=tuple(sorted(decode_assignment(assignment))), **fields)
    return MemberDescription(member_id, assignment=assignment, **fields)


def describe_group(session: SessionPort, group: str) -> GroupDescription:
    """The group's description: the backend's own, if it has members, else the generic records'."""
    group = check_key(group, "group name")
    own = session.backend_for_call().describe_coordinator_group(group)
    if own is not None and own.members:
        return own
    classic = _classic(session, group)
    if classic is not None and classic.members:
        return classic
    incremental = _incremental(session, group)
    if incremental is not None:
        return incremental
    return classic or own or GroupDescription(group, "empty", "empty")


def _classic(session: SessionPort, group: str) -> GroupDescription | None:
    backend = session.backend_for_call()
    layout = Layout(group)
    stored = backend.fetch(layout.record)
    record = GenerationRecord.decode(stored.value) if stored is not None else None
    if record is None:
        return None
    offers = [decode_offer(data) for data in backend.membership(layout.root).values()]
    protocol_type = next((o.protocol_type for o in offers if o is not None), None)
    done = record.completed
    assignments: dict[str, bytes] = {}
    if done is not None:
        raw = backend.fetch(layout.assignment(done.generation, done.leader))
        decoded = AssignmentRecord.decode(raw.value) if raw is not None else None
        assignments = decoded.assignments if decoded is not None else {}
    members = []
    for member_id in record.members:
        held = done is not None and member_id in done.members
        members.append(
            member(
                member_id,
                protocol_type,
                assignments.get(record.aliases.get(member_id, member_id)) if held else None,
                instance_id=record.statics.get(member_id),
                epoch=done.generation if held and done is not None else None,
            )
        )
    protocol = record.protocol or (done.protocol if done is not None else None)
    return GroupDescription(
        group,
        classic_mode(protocol_type, protocol),
        record.state,
        record.generation,
        protocol,
        protocol_type,
        tuple(members),
    )


def _incremental(session: SessionPort, group: str) -> GroupDescription | None:
    stored = session.backend_for_call().fetch(IncrementalLayout(group).state)
    state = GroupState.decode(stored.value) if stored is not None else None
    if state is None:
        return None
    reconciled = all(
        e.state == RECONCILED and e.epoch == state.assignment_epoch for e in state.members.values()
    )
    members = tuple(
        MemberDescription(
            m,
            instance_id=m[2:] if is_static(m) else None,
            epoch=entry.epoch,
            resources=tuple(sorted(entry.assigned)),
        )
        for m, entry in sorted(state.members.items())
    )
    return GroupDescription(
        group,
        "incremental",
        "stable" if reconciled else "reconciling",
        state.group_epoch,
        None,
        PROTOCOL_TYPE,
        members,
    )
