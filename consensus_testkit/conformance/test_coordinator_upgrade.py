"""Rolling upgrades of resource groups (KIP-429), eager to cooperative.

Contract: <https://consensus-api.github.io/consensus-api/spec/#8-coordinator-kip-795--the-kafka-rebalance-protocol-as-an-api>
"""

from __future__ import annotations

from collections.abc import Sequence

from consensus_api import Coordinator, ResourceHandler
from consensus_testkit.conformance.coordination import Ledger
from consensus_testkit.conformance.helpers import SessionFactory, unique, wait_until
from consensus_testkit.conformance.test_coordinator import REBALANCE, SETTLE

SIX = frozenset(f"r{index}" for index in range(6))
MIXED = ("cooperative-sticky", "range")


class _Group:
    """Resource members of one group, each on its own session, recorded in one ledger."""

    def __init__(self, open_session: SessionFactory) -> None:
        self.name, self.ledger = unique("ct-upgrade"), Ledger()
        self.members: dict[str, Coordinator] = {}
        self._open_session = open_session

    def start(self, member: str, assignors: Sequence[str]) -> Coordinator:
        """(Re)start ``member`` with ``assignors``: close its old coordinator first (a bounce)."""
        if member in self.members:
            self.members.pop(member).close()
        handler = ResourceHandler(SIX, self.ledger.listener(member), assignors=list(assignors))
        coordinator = handler.join(self._open_session(), self.name, rebalance_timeout=REBALANCE)
        coordinator.ensure_active_group(SETTLE)
        self.members[member] = coordinator
        return coordinator

    def wait_balanced(self, what: str) -> None:
        wait_until(
            lambda: self.ledger.balanced(list(self.members), SIX),
            SETTLE,
            what=what,
            observe=self.ledger.snapshot,
        )


def test_mixed_assignor_list_hands_resources_to_a_joiner(consensus_open_session: SessionFactory) -> None:
    """KIP-429's first bounce: A alone owns all 6 with ["cooperative-sticky", "range"]; B joins with
    the same list; both end owning resources, each resource owned once, never by two at a time."""
    group = _Group(consensus_open_session)
    group.start("a", MIXED)
    wait_until(lambda: group.ledger.snapshot()["a"] == SIX, SETTLE, what="a owns all 6")
    group.start("b", MIXED)
    group.wait_balanced("a and b share the 6 resources")
    snapshot = group.ledger.snapshot()
    assert len(snapshot["a"]) == len(snapshot["b"]) == 3, snapshot
    generation = group.members["b"].generation()
    assert generation is not None and generation.protocol_name == "cooperative-sticky"
    assert group.ledger.double_owned() == []


def test_two_bounce_upgrade_from_eager_to_cooperative(consensus_open_session: SessionFactory) -> None:
    """["range"] -> ["cooperative-sticky", "range"] -> ["cooperative-sticky"], restarting one member
    at a time: after every restart all 6 are owned once; the group ends cooperative, with no
    resource ever owned by two members."""
    group = _Group(consensus_open_session)
    for member in ("a", "b"):
        group.start(member, ["range"])
    group.wait_balanced("the eager group shares the resources")
    for assignors in (MIXED, ("cooperative-sticky",)):
        for member in ("a", "b"):
            group.start(member, assignors)
            group.wait_balanced(f"the resources are shared after {member} restarted with {assignors}")
    generations = [coordinator.generation() for coordinator in group.members.values()]
    assert {g.protocol_name for g in generations if g} == {"cooperative-sticky"}
    assert group.ledger.double_owned() == []
