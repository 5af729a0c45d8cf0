"""Static membership (KIP-345) and changing metadata.

Contract: <https://consensus-api.github.io/consensus-api/spec/#8-coordinator-kip-795--the-kafka-rebalance-protocol-as-an-api>
"""

from __future__ import annotations

import contextlib
import time

import pytest

from consensus_api import Coordinator, FencedError, Generation, OperationTimeoutError, ResourceHandler
from consensus_testkit.conformance.coordination import Ledger, RecordingHandler
from consensus_testkit.conformance.helpers import (
    SessionFactory,
    fires_within,
    stays_quiet,
    unique,
    wait_until,
)
from consensus_testkit.conformance.test_coordinator import (
    REBALANCE,
    SETTLE,
    _leader_view,
    _members,
    _settled,
    _wait_settled,
)
from consensus_testkit.conformance.test_coordinator_upgrade import SIX

#: How long a negative check waits for a rebalance that must not come: a member learns of a
#: rebalance within rebalance_timeout (it must rejoin by then), and each test shows with a positive
#: control that the same observation fires within this window when a rebalance does come.
QUIET = REBALANCE


def _join_in_background(open_session: SessionFactory, group: str) -> Coordinator:
    """A plain member that starts joining ``group`` (a rebalance) without waiting for it to settle."""
    joiner = open_session().coordinator(group, "test", RecordingHandler(), rebalance_timeout=REBALANCE)
    with contextlib.suppress(OperationTimeoutError):
        joiner.ensure_active_group(0.05)
    return joiner


def _static(open_session: SessionFactory, group: str, instance: str) -> tuple[Coordinator, RecordingHandler]:
    handler = RecordingHandler()
    coordinator = open_session().coordinator(
        group, "test", handler, rebalance_timeout=REBALANCE, group_instance_id=instance
    )
    coordinator.ensure_active_group(SETTLE)
    return coordinator, handler


def _last_assignment(handler: RecordingHandler) -> tuple[int, bytes]:
    generation, _, _, assignment = handler.named("complete")[-1].args
    assert isinstance(generation, int) and isinstance(assignment, bytes)
    return generation, assignment


def test_static_member_restart_gets_its_assignment_back_without_a_rebalance(
    consensus_open_session: SessionFactory,
) -> None:
    """A static member that closes and comes back (new session, same group_instance_id) within the
    session timeout completes the same generation with the same assignment; the others see nothing."""
    group = unique("ct-static")
    members = _members(consensus_open_session, group, 1)
    first = _static(consensus_open_session, group, "instance-1")
    before = _wait_settled([*members, first])
    held = _last_assignment(first[1])
    mark = len(members[0][1].calls)
    first[0].close()
    second = _static(consensus_open_session, group, "instance-1")
    assert _last_assignment(second[1]) == held
    assert second[0].generation().generation_id == before.generation_id
    assert second[1].named("prepare")[0].args == (-1, "")
    other = members[0][1]
    stays_quiet(lambda: other.calls.events[mark:], QUIET, what="the other member was disturbed")
    assert _wait_settled([*members, second], before.generation_id - 1) == members[0][0].generation()
    mark = len(other.calls)
    _join_in_background(consensus_open_session, group)
    fires_within(lambda: other.calls.events[mark:], QUIET, what="a joining member disturbs the other member")


def test_second_live_member_with_the_instance_id_fences_the_first(
    consensus_open_session: SessionFactory,
) -> None:
    """Two live members with one group_instance_id: the newer one takes the place; the older one
    is told (on_join_prepare(-1, "")) and its ensure_active_group raises FencedError."""
    group = unique("ct-static")
    members = _members(consensus_open_session, group, 1)
    older, older_handler = _static(consensus_open_session, group, "instance-1")
    _wait_settled([*members, (older, older_handler)])
    mark = len(older_handler.calls)
    newer = _static(consensus_open_session, group, "instance-1")

    def fenced() -> bool:
        try:
            older.ensure_active_group(0.2)
        except FencedError:
            return True
        except Exception:  # still running: a timeout until the group tells it
            return False
        return False

    wait_until(fenced, SETTLE, what="the older member to be fenced")
    assert ("prepare", (-1, "")) in [(c.name, c.args) for c in older_handler.calls.events[mark:]]
    settled = _wait_settled([*members, newer])
    assert newer[0].member_id() != older.member_id()
    assert isinstance(settled, Generation)
    with pytest.raises(FencedError):
        older.ensure_active_group(1)


def _completes_after(handler: RecordingHandler, generation: int) -> list[int]:
    return sorted(
        {int(str(c.args[0])) for c in handler.named("complete") if int(str(c.args[0])) > generation}
    )


def test_update_metadata_rebalances_exactly_once(consensus_open_session: SessionFactory) -> None:
    """update_metadata with unchanged metadata does nothing; with new metadata, one rebalance in
    which the leader sees it."""
    members = _members(consensus_open_session, unique("ct-meta"), 2)
    before = _wait_settled(members)
    coordinator, handler = members[1]

    def completed_after(generation: int) -> list[list[int]]:
        return [done for _, h in members if (done := _completes_after(h, generation))]

    coordinator.update_metadata()
    stays_quiet(lambda: completed_after(before.generation_id), QUIET, what="unchanged metadata rebalanced")
    handler.protocols = [("p1", b"changed")]
    coordinator.update_metadata()
    fires_within(lambda: completed_after(before.generation_id), QUIET, what="new metadata rebalances")
    after = _wait_settled(members, before.generation_id)
    assert _leader_view(members, after.generation_id)[coordinator.member_id()] == b"changed"
    stays_quiet(lambda: completed_after(after.generation_id), QUIET, what="a second rebalance followed")
    assert all(_completes_after(h, before.generation_id) == [after.generation_id] for _, h in members)


def test_update_resources_rebalances_exactly_once(consensus_open_session: SessionFactory) -> None:
    """ResourceHandler.update_resources: one rebalance; what the member no longer subscribes to
    moves to the other member, every resource stays owned once."""
    group, ledger = unique("ct-meta"), Ledger()
    handlers, coordinators = {}, {}
    for name in ("a", "b"):
        handlers[name] = ResourceHandler(SIX, ledger.listener(name), assignors=["cooperative-sticky"])
        coordinators[name] = handlers[name].join(consensus_open_session(), group, rebalance_timeout=REBALANCE)
        coordinators[name].ensure_active_group(SETTLE)
    wait_until(lambda: ledger.balanced(["a", "b"], SIX), SETTLE, what="a and b share 6")
    before = [coordinators[name].generation().generation_id for name in ("a", "b")]

    def newer_than(generation: int) -> list[int]:
        return [g for name in ("a", "b") if (g := coordinators[name].generation().generation_id) > generation]

    kept = frozenset(sorted(ledger.snapshot()["b"])[:1])
    handlers["b"].update_resources(kept)
    fires_within(lambda: newer_than(max(before)), QUIET, what="update_resources rebalances")
    wait_until(
        lambda: ledger.snapshot() == {"a": SIX - kept, "b": kept},
        SETTLE,
        what="b keeps only its one subscribed resource",
        observe=ledger.snapshot,
    )
    stays_quiet(lambda: newer_than(max(before) + 1), QUIET, what="a second rebalance followed")
    after = [coordinators[name].generation().generation_id for name in ("a", "b")]
    assert after[0] == after[1] == max(before) + 1, (before, after)
    assert ledger.double_owned() == []


def test_update_metadata_during_a_join_is_not_lost(consensus_open_session: SessionFactory) -> None:
    """New metadata announced while the member's join is under way (sent with the old metadata,
    held by the server for a slow member): another rebalance follows, in which the leader sees it."""
    group = unique("ct-meta")
    members = _members(consensus_open_session, group, 2)
    _wait_settled(members)
    (_, slow_handler), (coordinator, handler) = members
    slow_handler.hold_next_prepare(3.0)  # it rejoins 3 s late: the rebalance stays open
    mark = len(handler.calls.events)
    third = RecordingHandler()
    joiner = consensus_open_session().coordinator(group, "test", third, rebalance_timeout=REBALANCE)
    with contextlib.suppress(OperationTimeoutError):
        joiner.ensure_active_group(0.05)  # a third member joins: a rebalance
    wait_until(lambda: handler.named("prepare", mark), SETTLE, what="the member to rejoin")
    time.sleep(0.5)  # its join is on its way with the old metadata, held for the slow member
    handler.protocols = [("p1", b"changed")]
    coordinator.update_metadata()
    everyone = [*members, (joiner, third)]

    def seen() -> bool:
        settled = _settled(everyone)
        view = _leader_view(everyone, settled.generation_id) if settled is not None else {}
        return view.get(coordinator.member_id()) == b"changed"

    wait_until(seen, SETTLE, what="a stable generation whose leader saw the new metadata")
