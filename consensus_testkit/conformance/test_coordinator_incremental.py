"""The incremental coordinator's static membership and subscription changes.

Contract: <https://consensus-api.github.io/consensus-api/spec/#8-coordinator-kip-795--the-kafka-rebalance-protocol-as-an-api>
"""

from __future__ import annotations

import contextlib

import pytest

from consensus_api import FencedError, IncrementalCoordinator, OperationTimeoutError
from consensus_testkit.conformance.coordination import Ledger
from consensus_testkit.conformance.helpers import (
    SessionFactory,
    fires_within,
    stays_quiet,
    unique,
    wait_until,
)
from consensus_testkit.conformance.test_coordinator import REBALANCE, SETTLE
from consensus_testkit.conformance.test_coordinator_static import QUIET
from consensus_testkit.conformance.test_coordinator_upgrade import SIX
from consensus_testkit.faults import expire_session


class _Group:
    def __init__(self, open_session: SessionFactory) -> None:
        self.name, self.ledger = unique("ct-inc"), Ledger()
        self._open_session = open_session

    def join(self, name: str, instance: str | None = None, *, wait: bool = True) -> IncrementalCoordinator:
        """``name`` joins (as the static ``instance`` if given); ``wait``: until it takes part."""
        coordinator = self._open_session().incremental_coordinator(
            self.name,
            SIX,
            self.ledger.listener(name),
            rebalance_timeout=REBALANCE,
            group_instance_id=instance,
        )
        if wait:
            coordinator.ensure_active_group(SETTLE)
        else:
            with contextlib.suppress(OperationTimeoutError):
                coordinator.ensure_active_group(0.05)
        return coordinator

    def wait_shared(self, members: list[str], what: str) -> None:
        wait_until(
            lambda: self.ledger.balanced(members, SIX), SETTLE, what=what, observe=self.ledger.snapshot
        )


def test_incremental_static_member_restart_disturbs_nobody(consensus_open_session: SessionFactory) -> None:
    """A static member closed and started again (same group_instance_id) within the session timeout
    takes its resources back; the other member sees no callback."""
    group = _Group(consensus_open_session)
    group.join("a")
    first = group.join("s", "instance-1")
    group.wait_shared(["a", "s"], "a and s share the resources")
    held, mark = group.ledger.snapshot()["s"], group.ledger.mark()
    first.close()
    group.join("s", "instance-1")
    wait_until(lambda: group.ledger.snapshot()["s"] == held, SETTLE, what="s owns its resources again")
    stays_quiet(lambda: group.ledger.callbacks("a", mark), QUIET, what="the other member saw callbacks")
    assert group.ledger.double_owned() == []
    mark = group.ledger.mark()
    group.join("c", wait=False)
    fires_within(
        lambda: group.ledger.callbacks("a", mark), QUIET, what="a joining member moves a's resources"
    )


def test_incremental_second_member_of_an_instance_fences_the_first(
    consensus_open_session: SessionFactory,
) -> None:
    """A second live member with the instance id: the first stops everything and raises FencedError;
    the second owns the instance's resources."""
    group = _Group(consensus_open_session)
    group.join("a")
    older = group.join("old", "instance-1")
    group.wait_shared(["a", "old"], "a and old share the resources")
    group.join("new", "instance-1")
    group.wait_shared(["a", "new"], "a and new share the resources")
    assert group.ledger.snapshot()["old"] == frozenset()
    with pytest.raises(FencedError):
        older.ensure_active_group(1)
    assert group.ledger.double_owned() == []


def test_incremental_update_resources_moves_one_epoch(consensus_open_session: SessionFactory) -> None:
    """update_resources: one new group epoch; what b no longer subscribes to moves to a."""
    group = _Group(consensus_open_session)
    a, b = group.join("a"), group.join("b")
    group.wait_shared(["a", "b"], "a and b share the resources")
    before = max(a.epoch() or 0, b.epoch() or 0)
    kept = frozenset(sorted(group.ledger.snapshot()["b"])[:1])
    b.update_resources(kept)
    fires_within(lambda: (a.epoch() or 0) > before, QUIET, what="update_resources starts a new epoch")
    wait_until(
        lambda: group.ledger.snapshot() == {"a": SIX - kept, "b": kept},
        SETTLE,
        what="b keeps only its one subscribed resource",
        observe=group.ledger.snapshot,
    )
    wait_until(lambda: a.epoch() == b.epoch() == before + 1, SETTLE, what="one new epoch")
    stays_quiet(
        lambda: [e for e in (a.epoch(), b.epoch()) if (e or 0) > before + 1],
        QUIET,
        what="a second epoch followed",
    )
    assert a.epoch() == b.epoch() == before + 1
    assert group.ledger.double_owned() == []


@pytest.mark.session_expiry
def test_incremental_member_whose_session_is_lost_comes_back_as_a_joiner(
    consensus_open_session: SessionFactory,
) -> None:
    """The server ends b's session, three times: each time b stops everything at once and gets
    resources back only through the group, like any joiner, with the subscription it last set
    (``update_resources``); b never starts a resource another member owns. (a may start b's
    resources before b has heard of the expiry: the server ended b's session, so b had left.)"""
    group = _Group(consensus_open_session)
    group.join("a")
    session = consensus_open_session()
    b = session.incremental_coordinator(
        group.name, frozenset(), group.ledger.listener("b"), rebalance_timeout=REBALANCE
    )
    b.ensure_active_group(SETTLE)
    b.update_resources(SIX)  # its membership still names the empty subscription it joined with
    group.wait_shared(["a", "b"], "a and b share the resources")
    for _ in range(3):
        held, mark = group.ledger.snapshot()["b"], group.ledger.mark()
        expire_session(session)

        def stopped(held: frozenset[str] = held, mark: int = mark) -> bool:
            return ("-", held) in group.ledger.callbacks("b", mark)

        wait_until(
            stopped,
            SETTLE,
            what="b stops everything",
            observe=group.ledger.snapshot,
        )
        group.wait_shared(["a", "b"], "a and b share the resources again")
        assert [problem for problem in group.ledger.double_owned() if ": b started " in problem] == []
