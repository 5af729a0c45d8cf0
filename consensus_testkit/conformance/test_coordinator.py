"""The Coordinator (KIP-795) and incremental (KIP-848) rebalancing.

Contract: <https://consensus-api.github.io/consensus-api/spec/#8-coordinator-kip-795--the-kafka-rebalance-protocol-as-an-api>
"""

from __future__ import annotations

import signal
import time
from collections.abc import Sequence

import pytest

from consensus_api import (
    ConsensusError,
    Coordinator,
    Generation,
    InconsistentGroupProtocolError,
    InvalidKeyError,
    InvalidTypeError,
    ResourceHandler,
    Session,
    SessionLostError,
)
from consensus_testkit.conformance.coordination import CoordinatorChild, Ledger, RecordingHandler
from consensus_testkit.conformance.helpers import (
    EVENT_TIMEOUT,
    SessionFactory,
    loss_timeout,
    unique,
    wait_until,
)

#: The rebalance timeout of the coordinators under test.
REBALANCE = 4.0
#: How long a rebalance may take in these tests (joins of a few members, a detection delay).
SETTLE = EVENT_TIMEOUT + 2 * REBALANCE
RESOURCES = frozenset(f"r{index:02d}" for index in range(12))


def _members(
    open_session: SessionFactory,
    group: str,
    count: int,
    protocols: Sequence[tuple[str, bytes]] = (("p1", b"m"),),
) -> list[tuple[Coordinator, RecordingHandler]]:
    """``count`` members of ``group``, each on its own session, joined one after the other."""
    joined = []
    for _ in range(count):
        handler = RecordingHandler(protocols)
        coordinator = open_session().coordinator(group, "test", handler, rebalance_timeout=REBALANCE)
        coordinator.ensure_active_group(SETTLE)
        joined.append((coordinator, handler))
    return joined


def _settled(members: Sequence[tuple[Coordinator, RecordingHandler]]) -> Generation | None:
    """The generation every member holds, stable, once they agree."""
    generations = [coordinator.generation_if_stable() for coordinator, _ in members]
    if any(g is None for g in generations) or len({g.generation_id for g in generations if g}) != 1:
        return None
    return generations[0]


def _wait_settled(
    members: Sequence[tuple[Coordinator, RecordingHandler]], after: int = -1, timeout: float = SETTLE
) -> Generation:
    def newer() -> Generation | None:
        generation = _settled(members)
        return generation if generation is not None and generation.generation_id > after else None

    return wait_until(
        newer,
        timeout,
        what=f"every member to hold one stable generation newer than {after}",
        observe=lambda: [c.generation_if_stable() for c, _ in members],
    )


def _leader_view(
    members: Sequence[tuple[Coordinator, RecordingHandler]], generation: int
) -> dict[str, bytes]:
    """The members the leader of ``generation`` assigned: its perform_assignment call between its
    previous on_join_complete and that of ``generation``."""
    for _, handler in members:
        pending: dict[str, bytes] | None = None
        for call in handler.calls.events:
            if call.name == "assign":
                assert isinstance(call.args[2], dict)
                pending = call.args[2]
            elif call.name == "complete":
                if call.args[0] == generation and pending is not None:
                    return pending
                pending = None
    raise AssertionError(f"no member ran perform_assignment for generation {generation}")


def test_single_member_leads_and_assigns(consensus_session: Session) -> None:
    """One member: prepare(-1, ''), perform_assignment as leader, complete; on the coordinator thread."""
    handler = RecordingHandler((("p1", b"meta-1"),))
    coordinator = consensus_session.coordinator(
        unique("ct-coord"), "test", handler, rebalance_timeout=REBALANCE
    )
    generation = coordinator.ensure_active_group(SETTLE)
    me = coordinator.member_id()
    assert generation == Generation(generation.generation_id, me, "p1")
    assert generation.generation_id >= 1
    assert coordinator.generation() == coordinator.generation_if_stable() == generation
    names = [call.name for call in handler.calls.events]
    assert names == ["prepare", "assign", "complete"], handler.calls.events
    prepare, assign, complete = handler.calls.events
    assert prepare.args == (-1, "")
    assert assign.args == (me, "p1", {me: b"meta-1"})
    assert complete.args == (generation.generation_id, me, "p1", f"p1:{me}".encode())
    assert all(call.thread.startswith("consensus-coordinator") for call in handler.calls.events)


def test_assignment_reaches_every_member(consensus_open_session: SessionFactory) -> None:
    """Three members settle on one generation; each receives what the leader assigned to it."""
    members = _members(consensus_open_session, unique("ct-coord"), 3)
    generation = _wait_settled(members)
    ids = {coordinator.member_id() for coordinator, _ in members}
    assert set(_leader_view(members, generation.generation_id)) == ids
    leaders = {call.args[0] for _, h in members for call in h.named("assign")}
    for coordinator, handler in members:
        last = handler.named("complete")[-1]
        assert last.args == (
            generation.generation_id,
            coordinator.member_id(),
            "p1",
            f"p1:{last.args[1]}".encode(),
        )
        handler.check_order()
    assert leaders <= ids


def test_protocol_is_the_most_preferred_every_member_supports(consensus_open_session: SessionFactory) -> None:
    """Kafka's negotiation: among protocols all support, the one most members prefer; its metadata."""
    group = unique("ct-coord")
    members = [
        _members(consensus_open_session, group, 1, [("x", b"ax"), ("p1", b"a1"), ("p2", b"a2")])[0],
        _members(consensus_open_session, group, 1, [("p2", b"b2"), ("p1", b"b1")])[0],
        _members(consensus_open_session, group, 1, [("p1", b"c1"), ("p2", b"c2")])[0],
    ]
    generation = _wait_settled(members)
    assert generation.protocol_name == "p1"
    view = _leader_view(members, generation.generation_id)
    expected = {c.member_id(): meta for (c, _), meta in zip(members, (b"a1", b"b1", b"c1"), strict=True)}
    assert view == expected


def test_incompatible_joiner_is_rejected_and_group_undisturbed(
    consensus_open_session: SessionFactory,
) -> None:
    """A joiner sharing no protocol (or another protocol type) gets InconsistentGroupProtocolError;
    the group's members see no rebalance."""
    group = unique("ct-coord")
    members = _members(consensus_open_session, group, 2)
    generation = _wait_settled(members)
    marks = [len(handler.calls) for _, handler in members]
    stranger = consensus_open_session().coordinator(
        group, "test", RecordingHandler([("p9", b"")]), rebalance_timeout=REBALANCE
    )
    with pytest.raises(InconsistentGroupProtocolError):
        stranger.ensure_active_group(SETTLE)
    other_type = consensus_open_session().coordinator(
        group, "other", RecordingHandler(), rebalance_timeout=REBALANCE
    )
    with pytest.raises(InconsistentGroupProtocolError):
        other_type.ensure_active_group(SETTLE)
    time.sleep(2.0)
    assert [len(handler.calls) for _, handler in members] == marks
    assert _settled(members) == generation
    # The positive control: a compatible joiner makes every member rebalance, and what each is told
    # first since the rejections is on_join_prepare from the same generation - nothing came between.
    joined = _wait_settled([*members, *_members(consensus_open_session, group, 1)], generation.generation_id)
    for (coordinator, handler), mark in zip(members, marks, strict=True):
        prepare = handler.calls.events[mark]
        assert (prepare.name, prepare.args) == (
            "prepare",
            (generation.generation_id, coordinator.member_id()),
        )
        handler.calls.wait_for(
            lambda call: call.name == "complete" and call.args[0] == joined.generation_id,
            since=mark,
            what=f"on_join_complete of generation {joined.generation_id}",
        )


def test_rebalance_on_join(consensus_open_session: SessionFactory) -> None:
    """A new member makes every member prepare with its generation and complete a newer one."""
    group = unique("ct-coord")
    members = _members(consensus_open_session, group, 2)
    before = _wait_settled(members)
    marks = [len(handler.calls) for _, handler in members]
    members += _members(consensus_open_session, group, 1)
    after = _wait_settled(members, before.generation_id)
    assert set(_leader_view(members, after.generation_id)) == {c.member_id() for c, _ in members}
    for (coordinator, handler), mark in zip(members[:2], marks, strict=True):
        prepares = handler.named("prepare", mark)
        assert prepares and prepares[0].args == (before.generation_id, coordinator.member_id())
        handler.check_order()


def test_rebalance_on_leave(consensus_open_session: SessionFactory) -> None:
    """A member that closes gets on_leave_prepare; the others complete a generation without it."""
    group = unique("ct-coord")
    members = _members(consensus_open_session, group, 3)
    before = _wait_settled(members)
    leaving, leaving_handler = members.pop()
    leaving.close()
    assert [call.name for call in leaving_handler.calls.events][-1] == "leave"
    after = _wait_settled(members, before.generation_id)
    assert set(_leader_view(members, after.generation_id)) == {c.member_id() for c, _ in members}
    with pytest.raises(SessionLostError):
        leaving.ensure_active_group(1)


def test_rebalance_on_crash(
    consensus_open_session: SessionFactory, consensus_url: str, consensus_options: dict[str, object]
) -> None:
    """A member whose process is SIGKILLed drops out: the others complete a generation without it."""
    group = unique("ct-coord")
    members = _members(consensus_open_session, group, 1)
    child = CoordinatorChild(consensus_url, group, {**consensus_options, "rebalance_timeout": REBALANCE})
    try:
        _, generation, child_id = child.expect("COMPLETE", SETTLE)[1].split()
        with_child = _wait_settled(members, int(generation) - 1)
        assert child_id in _leader_view(members, with_child.generation_id)
        child.signal(signal.SIGKILL)
        bound = loss_timeout(float(str(consensus_options.get("session_timeout", 10)))) + SETTLE
        after = _wait_settled(members, with_child.generation_id, bound)
        assert child_id not in _leader_view(members, after.generation_id)
    finally:
        child.close()


def test_generation_fencing(consensus_open_session: SessionFactory) -> None:
    """A member too slow to rejoin is left out of the next generation; it never completes that
    generation, and is told (on_join_prepare) before it joins a later one."""
    group = unique("ct-coord")
    members = _members(consensus_open_session, group, 2)
    before = _wait_settled(members)
    slow, slow_handler = members[1]
    mark = len(slow_handler.calls)
    slow_handler.hold_next_prepare(REBALANCE * 2.5)
    newcomer = _members(consensus_open_session, group, 1)
    passed = _wait_settled([members[0], *newcomer], before.generation_id)
    assert slow.member_id() not in _leader_view([members[0], *newcomer], passed.generation_id)
    everyone = [*members, *newcomer]
    final = _wait_settled(everyone, passed.generation_id)
    completes = [int(str(call.args[0])) for call in slow_handler.named("complete", mark)]
    assert passed.generation_id not in completes
    assert completes and completes[-1] == final.generation_id
    assert slow_handler.named("prepare", mark)
    slow_handler.check_order()


@pytest.mark.parametrize("assignor", ["range", "cooperative-sticky"])
def test_resources_are_never_owned_twice(consensus_open_session: SessionFactory, assignor: str) -> None:
    """Eager (range) and cooperative (cooperative-sticky): through joins and a leave, every resource
    ends with exactly one member and no resource is owned by two members at any instant;
    cooperatively, members keep what does not move."""
    group, ledger = unique("ct-coord"), Ledger()
    coordinators: list[Coordinator] = []

    def add(name: str) -> None:
        handler = ResourceHandler(RESOURCES, ledger.listener(name), assignors=[assignor])
        coordinators.append(handler.join(consensus_open_session(), group, rebalance_timeout=REBALANCE))
        coordinators[-1].ensure_active_group(SETTLE)

    for name in ("a", "b", "c"):
        add(name)
    wait_until(
        lambda: ledger.balanced(["a", "b", "c"], RESOURCES), SETTLE, what="3 members share the resources"
    )
    before, mark = ledger.snapshot(), ledger.mark()
    add("d")
    wait_until(lambda: ledger.balanced(["a", "b", "c", "d"], RESOURCES), SETTLE, what="4 members share them")
    if assignor == "cooperative-sticky":
        for name in ("a", "b", "c"):
            revoked = frozenset().union(*(r for kind, r in ledger.callbacks(name, mark) if kind == "-"))
            assert revoked == before[name] - ledger.snapshot()[name], (
                f"{name} revoked what it kept: {revoked}"
            )
    coordinators[0].close()
    wait_until(lambda: ledger.balanced(["b", "c", "d"], RESOURCES), SETTLE, what="the others take a's share")
    assert ledger.double_owned() == []


def test_incremental_no_barrier_no_double_ownership(consensus_open_session: SessionFactory) -> None:
    """Incremental mode: joins and a leave reconcile member by member; no resource is owned twice;
    members whose assignment does not change see no callback."""
    group, ledger = unique("ct-inc"), Ledger()
    resources = frozenset(f"t{index}" for index in range(8))
    coordinators = {}
    for name in ("a", "b", "c", "d"):
        coordinator = consensus_open_session().incremental_coordinator(
            group, resources, ledger.listener(name), rebalance_timeout=REBALANCE
        )
        coordinator.ensure_active_group(SETTLE)
        coordinators[name] = coordinator
    wait_until(lambda: ledger.balanced(list(coordinators), resources), SETTLE, what="4 members share 8")
    before, mark = ledger.snapshot(), ledger.mark()
    coordinators["e"] = consensus_open_session().incremental_coordinator(
        group, resources, ledger.listener("e"), rebalance_timeout=REBALANCE
    )
    coordinators["e"].ensure_active_group(SETTLE)
    wait_until(lambda: ledger.balanced(list(coordinators), resources), SETTLE, what="5 members share 8")
    after = ledger.snapshot()
    unchanged = [name for name in "abcd" if after[name] == before[name]]
    assert unchanged, f"the sticky target moved every member: {before} -> {after}"
    for name in unchanged:
        assert ledger.callbacks(name, mark) == [], f"{name} was disturbed"
    for name, coordinator in coordinators.items():
        assert coordinator.assignment() == after[name]
    coordinators.pop("a").close()
    wait_until(lambda: ledger.balanced(list(coordinators), resources), SETTLE, what="a's share moves on")
    assert ledger.double_owned() == []


def test_arguments_are_checked(consensus_session: Session) -> None:
    """Bad group names, handlers and protocol types fail before any I/O; closed coordinators refuse."""
    with pytest.raises(InvalidKeyError):
        consensus_session.coordinator("bad//name", "test", RecordingHandler())
    with pytest.raises(InvalidTypeError):
        consensus_session.coordinator(unique("ct-coord"), "test", object())  # type: ignore[arg-type]
    with pytest.raises(InvalidKeyError):
        consensus_session.coordinator(unique("ct-coord"), "a/b", RecordingHandler())
    coordinator = consensus_session.coordinator(unique("ct-coord"), "test", RecordingHandler())
    coordinator.close()
    with pytest.raises(SessionLostError):
        coordinator.ensure_active_group(1)


def test_ensure_active_group_refused_inside_a_callback(consensus_session: Session) -> None:
    """Calling ensure_active_group from a handler callback raises ConsensusError itself at once - a
    refusal, not the OperationTimeoutError (a subclass) of a wait that could never end."""
    errors: list[BaseException] = []

    class Reentrant(RecordingHandler):
        coordinator: Coordinator | None = None

        def on_join_complete(self, generation: int, member_id: str, protocol: str, assignment: bytes) -> None:
            super().on_join_complete(generation, member_id, protocol, assignment)
            try:
                assert self.coordinator is not None
                self.coordinator.ensure_active_group(SETTLE)
            except ConsensusError as exc:
                errors.append(exc)

    handler = Reentrant()
    handler.coordinator = consensus_session.coordinator(
        unique("ct-coord"), "test", handler, rebalance_timeout=REBALANCE
    )
    handler.coordinator.ensure_active_group(SETTLE)
    assert len(errors) == 1
    assert type(errors[0]) is ConsensusError, repr(errors[0])
