"""Online migration of a resource group between the classic protocol and the
incremental one (and back), by rolling restarts, one member at a time.

Contract: <https://consensus-api.github.io/consensus-api/spec/#8-coordinator-kip-795--the-kafka-rebalance-protocol-as-an-api>
"""

from __future__ import annotations

from consensus_api import Coordinator, IncrementalCoordinator, ResourceHandler
from consensus_testkit.conformance.coordination import Ledger
from consensus_testkit.conformance.helpers import SessionFactory, unique, wait_until
from consensus_testkit.conformance.test_coordinator import REBALANCE, SETTLE
from consensus_testkit.conformance.test_coordinator_upgrade import SIX


class _Roll:
    """Members of one group restarted one at a time in a mode: cooperative, eager or incremental."""

    def __init__(self, open_session: SessionFactory) -> None:
        self.group, self.ledger = unique("ct-migrate"), Ledger()
        self.members: dict[str, Coordinator | IncrementalCoordinator] = {}
        self._open_session = open_session

    def start(self, name: str, mode: str) -> None:
        if name in self.members:
            self.members.pop(name).close()
        session, listener = self._open_session(), self.ledger.listener(name)
        if mode == "incremental":
            member: Coordinator | IncrementalCoordinator = session.incremental_coordinator(
                self.group, SIX, listener, rebalance_timeout=REBALANCE
            )
        else:
            assignor = "cooperative-sticky" if mode == "cooperative" else "range"
            handler = ResourceHandler(SIX, listener, assignors=[assignor])
            member = handler.join(session, self.group, rebalance_timeout=REBALANCE)
        member.ensure_active_group(SETTLE)
        self.members[name] = member

    def owned_once(self, owners: int) -> bool:
        """Every resource owned by exactly one member, ``owners`` members owning some."""
        held = list(self.ledger.snapshot().values())
        union = frozenset().union(*held)
        return sum(map(len, held)) == len(SIX) and union == SIX and sum(1 for h in held if h) == owners

    def wait(self, owners: int, what: str) -> None:
        wait_until(lambda: self.owned_once(owners), 2 * SETTLE, what=what, observe=self.ledger.snapshot)


def test_rolling_migration_classic_to_incremental_and_back(consensus_open_session: SessionFactory) -> None:
    """cooperative -> incremental -> eager, one member at a time: the old mode keeps every resource
    until its last member leaves, then the new mode takes them; never owned by two members."""
    roll = _Roll(consensus_open_session)
    for name in ("a", "b"):
        roll.start(name, "cooperative")
    roll.wait(2, "the classic group shares the resources")
    for mode in ("incremental", "eager"):
        roll.start("a", mode)
        roll.wait(1, f"b (the old mode) owns everything while a runs {mode}")
        roll.start("b", mode)
        roll.wait(2, f"both run {mode} and share the resources")
    assert roll.ledger.double_owned() == []
