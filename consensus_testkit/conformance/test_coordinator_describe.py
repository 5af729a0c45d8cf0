"""``session.describe_group`` (``consensus group describe``).

Contract: <https://consensus-api.github.io/consensus-api/spec/#8-coordinator-kip-795--the-kafka-rebalance-protocol-as-an-api>
"""

from __future__ import annotations

from consensus_api import GroupDescription, ResourceHandler
from consensus_testkit.conformance.coordination import Ledger
from consensus_testkit.conformance.helpers import SessionFactory, unique, wait_until
from consensus_testkit.conformance.test_coordinator import REBALANCE, SETTLE
from consensus_testkit.conformance.test_coordinator_upgrade import SIX


def test_describe_shows_mode_members_instances_and_assignments(
    consensus_open_session: SessionFactory,
) -> None:
    """A cooperative resource group and an incremental one: each described with its mode, stable
    state, protocol, every member with its instance id and the resources it owns."""
    group, ledger = unique("ct-describe"), Ledger()
    coordinators = {}
    for name, instance in (("a", "worker-a"), ("b", None)):
        handler = ResourceHandler(SIX, ledger.listener(name), assignors=["cooperative-sticky"])
        coordinators[name] = handler.join(
            consensus_open_session(), group, rebalance_timeout=REBALANCE, group_instance_id=instance
        )
        coordinators[name].ensure_active_group(SETTLE)
    wait_until(lambda: ledger.balanced(["a", "b"], SIX), SETTLE, what="a and b share the resources")
    session = consensus_open_session()

    def described_stable() -> GroupDescription | None:
        described = session.describe_group(group)
        return described if described.state == "stable" and len(described.members) == 2 else None

    classic = wait_until(described_stable, SETTLE, what="a stable description with both members")
    assert (classic.mode, classic.protocol, classic.protocol_type) == (
        "cooperative",
        "cooperative-sticky",
        "resources",
    )
    by_id = {m.member_id: m for m in classic.members}
    snapshot = ledger.snapshot()
    for name, instance in (("a", "worker-a"), ("b", None)):
        described = by_id[coordinators[name].member_id()]
        assert described.instance_id == instance
        assert frozenset(described.resources or ()) == snapshot[name]
    incremental_group = unique("ct-describe")
    member = consensus_open_session().incremental_coordinator(
        incremental_group, SIX, Ledger().listener("x"), group_instance_id="worker-x"
    )
    epoch = member.ensure_active_group(SETTLE)
    incremental = session.describe_group(incremental_group)
    assert (incremental.mode, incremental.generation) == ("incremental", epoch)
    assert [(m.instance_id, m.resources) for m in incremental.members] == [("worker-x", tuple(sorted(SIX)))]
    assert session.describe_group(unique("ct-describe")).mode == "empty"
