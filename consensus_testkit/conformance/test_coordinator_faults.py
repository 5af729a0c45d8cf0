"""The Coordinator under faults: the coordinating member SIGKILLed mid-rebalance, a member paused past
``rebalance_timeout``, the server restarted during a rebalance. Each ends with every resource owned
by exactly one member, none ever owned by two live members at once.

Contract: <https://consensus-api.github.io/consensus-api/spec/#8-coordinator-kip-795--the-kafka-rebalance-protocol-as-an-api>
"""

from __future__ import annotations

import contextlib
import signal
import time
from typing import TYPE_CHECKING

import pytest

from consensus_api import Coordinator, IncrementalCoordinator, OperationTimeoutError, ResourceHandler
from consensus_testkit.conformance.coordination import CoordinatorChild, Ledger, owned_by
from consensus_testkit.conformance.helpers import SessionFactory, loss_timeout, unique, wait_until
from consensus_testkit.conformance.test_coordinator import REBALANCE, SETTLE
from consensus_testkit.conformance.test_coordinator_upgrade import SIX

if TYPE_CHECKING:
    from consensus_api.session import Session
    from consensus_testkit import ServerHandle


def _join(session: Session, group: str, ledger: Ledger, name: str) -> Coordinator:
    """A resource member ``name`` of ``group`` on ``session``, its thread started without waiting for
    the group."""
    handler = ResourceHandler(SIX, ledger.listener(name), assignors=["cooperative-sticky"])
    coordinator = handler.join(session, group, rebalance_timeout=REBALANCE)
    with contextlib.suppress(OperationTimeoutError):
        coordinator.ensure_active_group(0.05)
    return coordinator


def _child(url: str, group: str, options: dict[str, object], **extra: object) -> CoordinatorChild:
    return CoordinatorChild(url, group, {**options, "rebalance_timeout": REBALANCE, "resources": 6, **extra})


def _loss(options: dict[str, object]) -> float:
    return loss_timeout(float(str(options.get("session_timeout", 10)))) + SETTLE


def test_coordinating_member_killed_mid_rebalance(
    consensus_open_session: SessionFactory, consensus_url: str, consensus_options: dict[str, object]
) -> None:
    """The first member (the group's arbiter and leader; on Kafka the leader) is SIGKILLed while it
    computes the assignment of a rebalance; the survivor takes every resource, and only after the kill."""
    group, ledger = unique("ct-cfault"), Ledger()
    child = _child(consensus_url, group, consensus_options, hold_assign=60)
    try:
        child.expect("COMPLETE", SETTLE)
        wait_until(lambda: owned_by(child) == SIX, SETTLE, what="the child owns all 6")
        mark = len(child.lines)
        _join(consensus_open_session(), group, ledger, "a")
        child.expect("ASSIGNING", SETTLE, since=mark)
        killed = ledger.mark()
        child.signal(signal.SIGKILL)
        wait_until(lambda: ledger.snapshot()["a"] == SIX, _loss(consensus_options), what="a takes all 6")
        assert ledger.events[:killed] == [], "a started a resource while the child still owned it"
        _join(consensus_open_session(), group, ledger, "b")
        wait_until(lambda: ledger.balanced(["a", "b"], SIX), SETTLE, what="a and b share the resources")
        assert ledger.double_owned() == [], ledger.events
    finally:
        child.close()


@pytest.mark.freezes_a_writer
def test_member_paused_past_rebalance_timeout_is_fenced_and_told(
    consensus_open_session: SessionFactory, consensus_url: str, consensus_options: dict[str, object]
) -> None:
    """A member SIGSTOPped through a rebalance is left out and its resources move; resumed, it is
    told (on_join_prepare(-1, ""), everything revoked) and joins again; all 6 end owned once."""
    group, ledger = unique("ct-cfault"), Ledger()
    _join(consensus_open_session(), group, ledger, "a")
    wait_until(lambda: ledger.snapshot()["a"] == SIX, SETTLE, what="a owns all 6")
    child = _child(consensus_url, group, consensus_options)
    try:
        wait_until(lambda: len(owned_by(child)) == 3, SETTLE, what="the child owns 3")
        child.signal(signal.SIGSTOP)
        paused = time.monotonic()
        _join(consensus_open_session(), group, ledger, "b")
        wait_until(lambda: ledger.balanced(["a", "b"], SIX), _loss(consensus_options), what="a, b take all 6")
        time.sleep(max(0.0, paused + REBALANCE - time.monotonic()))
        mark = len(child.lines)
        child.signal(signal.SIGCONT)
        child.expect("PREPARE -1", SETTLE, since=mark)
        revoked = child.expect("REVOKED", SETTLE, since=mark)[0]
        lines = child.lines.events
        assert all(
            index > revoked for index in range(mark, len(lines)) if lines[index].startswith("ASSIGNED")
        )

        def shared() -> bool:
            ours = ledger.snapshot()
            held = [ours["a"], ours["b"], owned_by(child)]
            return sum(map(len, held)) == len(SIX) and frozenset().union(*held) == SIX and all(held)

        wait_until(shared, _loss(consensus_options), what="a, b and the child share the 6 resources")
        assert ledger.double_owned() == [], ledger.events
    finally:
        child.close()


@pytest.mark.requires_server
def test_server_restarted_during_a_rebalance(
    consensus_server: ServerHandle,
    consensus_open_session: SessionFactory,
    consensus_options: dict[str, object],
) -> None:
    """The server is killed as a third member joins and restarted a second later: the group
    converges with every resource owned by exactly one member.

    The joiner's session is open before the kill, so the fault hits its join, not its ``connect``:
    ``connect`` rightly raises ``BackendUnavailableError`` once ``connect_timeout`` (10 s here)
    passes without a server, and a Kafka broker is ready again 5 s after the kill when idle but
    10-24 s after it under CI's load (load average 17-30), so a connect racing the kill failed
    and the member never existed. The bound starts once the server is ready: each session notices
    its loss (``loss_timeout``), then a rebalance of three members (``SETTLE``), with ``SETTLE``
    to spare for the rejoin after the session recovers."""
    group, ledger = unique("ct-cfault"), Ledger()
    for name in ("a", "b"):
        _join(consensus_open_session(), group, ledger, name)
    wait_until(lambda: ledger.balanced(["a", "b"], SIX), SETTLE, what="a and b share the resources")
    _join(consensus_open_session(), group, ledger, "c")  # its session is open before the kill
    consensus_server.kill()
    time.sleep(1.0)
    consensus_server.restart()
    bound = _loss(consensus_options) + SETTLE
    wait_until(
        lambda: ledger.balanced(["a", "b", "c"], SIX),
        bound,
        what="a, b and c share the resources",
        observe=ledger.snapshot,
    )
    assert ledger.double_owned() == [], ledger.events


@pytest.mark.freezes_a_writer
def test_incremental_member_that_does_not_revoke_in_time_is_fenced(
    consensus_open_session: SessionFactory, consensus_url: str, consensus_options: dict[str, object]
) -> None:
    """Incremental mode: a member SIGSTOPped when it must revoke (a subscription grew; its session
    outlasts the pause) is fenced after rebalance_timeout and its resources move; resumed, it stops
    everything and comes back; no resource is started while a live, unfenced member owns it."""
    group, ledger, timeout = unique("ct-cfault"), Ledger(), 2.0

    def incremental(name: str, resources: frozenset[str]) -> IncrementalCoordinator:
        member = consensus_open_session().incremental_coordinator(
            group, resources, ledger.listener(name), rebalance_timeout=timeout
        )
        member.ensure_active_group(SETTLE)
        return member

    incremental("a", SIX)
    b = incremental("b", frozenset())  # subscribes to nothing yet
    options = {**consensus_options, "session_timeout": 15, "rebalance_timeout": timeout}
    child = CoordinatorChild(consensus_url, group, {**options, "resources": 6, "incremental": 1})
    try:
        wait_until(lambda: len(owned_by(child)) == 3, SETTLE, what="the child owns 3")
        child.expect("RECONCILED", SETTLE)  # paused idle, not inside its first reconcile
        child.signal(signal.SIGSTOP)
        paused = time.monotonic()
        b.update_resources(SIX)  # the child must give one up, and cannot
        wait_until(lambda: ledger.balanced(["a", "b"], SIX), SETTLE, what="a and b take all 6")
        assert time.monotonic() - paused < 15, "fenced by its session's expiry, not by rebalance_timeout"
        mark = len(child.lines)
        child.signal(signal.SIGCONT)
        child.expect("REVOKED", SETTLE, since=mark)

        def shared() -> bool:
            held = [*ledger.snapshot().values(), owned_by(child)]
            return sum(map(len, held)) == len(SIX) and frozenset().union(*held) == SIX and all(held)

        wait_until(
            shared,
            SETTLE,
            what="a, b and the child share the 6 resources",
            observe=lambda: (ledger.snapshot(), owned_by(child), child.lines.events[mark:]),
        )
        assert ledger.double_owned() == [], ledger.events
    finally:
        child.close()
