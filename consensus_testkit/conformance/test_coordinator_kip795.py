"""KIP-795's observable AbstractCoordinator semantics.

Contract: <https://consensus-api.github.io/consensus-api/spec/#8-coordinator-kip-795--the-kafka-rebalance-protocol-as-an-api>
"""

from __future__ import annotations

import threading
import time

import pytest

from consensus_api import NO_GENERATION, OperationTimeoutError, Session
from consensus_testkit.conformance.coordination import RecordingHandler
from consensus_testkit.conformance.helpers import SessionFactory, unique, wait_until
from consensus_testkit.conformance.test_coordinator import REBALANCE, SETTLE, _members, _wait_settled


class _FailingCompletion(RecordingHandler):
    """Its on_join_complete raises until ``released`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.released = threading.Event()

    def on_join_complete(self, generation: int, member_id: str, protocol: str, assignment: bytes) -> None:
        super().on_join_complete(generation, member_id, protocol, assignment)
        if not self.released.is_set():
            raise RuntimeError("the application is not ready")


def test_on_join_complete_is_retried_until_it_returns(consensus_session: Session) -> None:
    """An on_join_complete that raises is called again with the same arguments (no prepare
    between); meanwhile generation() names the generation but it is not stable."""
    handler = _FailingCompletion()
    coordinator = consensus_session.coordinator(
        unique("ct-kip795"), "test", handler, rebalance_timeout=REBALANCE
    )
    deadline = time.monotonic() + SETTLE  # a join on a loaded machine may take longer than one try
    while len(handler.named("complete")) < 2 and time.monotonic() < deadline:
        with pytest.raises(OperationTimeoutError):
            coordinator.ensure_active_group(1.5)
    completes = handler.named("complete")
    assert len(completes) >= 2 and len({call.args for call in completes}) == 1, completes
    assert coordinator.generation().generation_id == completes[0].args[0]
    assert coordinator.generation_if_stable() is None
    handler.released.set()
    generation = coordinator.ensure_active_group(SETTLE)
    assert generation.generation_id == completes[0].args[0]
    assert [call.name for call in handler.calls.events].count("prepare") == 1
    handler.check_order()


def test_no_generation_before_the_first_join_and_after_close(consensus_session: Session) -> None:
    """generation() is NO_GENERATION (-1, no member id) before the first join and once closed;
    in between, it has a member id."""
    coordinator = consensus_session.coordinator(
        unique("ct-kip795"), "test", RecordingHandler(), rebalance_timeout=REBALANCE
    )
    assert coordinator.generation() == NO_GENERATION
    assert not NO_GENERATION.has_member_id() and NO_GENERATION.generation_id == -1
    assert coordinator.generation_if_stable() is None
    generation = coordinator.ensure_active_group(SETTLE)
    assert generation.has_member_id() and generation.member_id == coordinator.member_id()
    assert coordinator.generation() == generation
    coordinator.close()
    assert coordinator.generation() == NO_GENERATION
    assert coordinator.generation_if_stable() is None


def test_generation_if_stable_is_none_while_a_rebalance_is_under_way(
    consensus_open_session: SessionFactory,
) -> None:
    """While a member rejoins, generation_if_stable() is None and generation() still names the
    generation it holds; once the rebalance completes both name the new one."""
    group = unique("ct-kip795")
    members = _members(consensus_open_session, group, 1)
    (coordinator, handler) = members[0]
    before = coordinator.ensure_active_group(SETTLE)
    handler.hold_next_prepare(2.0)
    joiner = RecordingHandler()
    newcomer = consensus_open_session().coordinator(group, "test", joiner, rebalance_timeout=REBALANCE)
    joining = threading.Thread(target=newcomer.ensure_active_group, args=(SETTLE,), daemon=True)
    joining.start()
    wait_until(lambda: coordinator.generation_if_stable() is None, SETTLE, what="the rebalance to start")
    assert coordinator.generation() == before
    after = _wait_settled([*members, (newcomer, joiner)], before.generation_id)
    joining.join(SETTLE)
    assert coordinator.generation() == coordinator.generation_if_stable() == after
