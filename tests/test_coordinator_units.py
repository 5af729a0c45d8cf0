"""The backend-independent parts of the Coordinator: assignors, negotiation, KIP-848 reconciliation,
and the checks of what an application passes in."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from consensus_api.assignors import (
    ASSIGNORS,
    CooperativeStickyAssignor,
    RangeAssignor,
    RoundRobinAssignor,
    StickyAssignor,
    Subscription,
    get_assignor,
)
from consensus_api.coordinator.generic.negotiation import Offer, admit, choose, compatible
from consensus_api.coordinator.generic.reconcile import FENCED, UNREVOKED, Ack, GroupState, reconcile
from consensus_api.coordinator.generic.records import STABLE, Completed, GenerationRecord
from consensus_api.coordinator.generic.static import StaticMembers, replace
from consensus_api.coordinator.handler import (
    assignor_named,
    check_resource_listener,
    require_callbacks,
    resource_names,
)
from consensus_api.coordinator.resources import ResourceHandler
from consensus_api.errors import ConfigurationError, InvalidKeyError, InvalidTypeError

RESOURCES = frozenset(f"r{i:02d}" for i in range(10))


def _everyone(
    members: list[str], owned: Mapping[str, frozenset[str]] | None = None
) -> dict[str, Subscription]:
    owned = owned or {}
    return {m: Subscription(RESOURCES, owned.get(m, frozenset()), 1) for m in members}


@pytest.mark.parametrize("name", sorted(ASSIGNORS))
def test_every_resource_goes_to_one_member_balanced(name: str) -> None:
    """Each assignor gives every resource to exactly one member, counts within one of each other."""
    result = get_assignor(name).assign(_everyone(["a", "b", "c"]))
    assert sorted(r for rs in result.values() for r in rs) == sorted(RESOURCES)
    assert max(map(len, result.values())) - min(map(len, result.values())) <= 1


def test_range_gives_contiguous_ranges() -> None:
    """range: the first member gets the first (and one extra) sorted resources."""
    result = RangeAssignor().assign(_everyone(["a", "b", "c"]))
    assert result["a"] == {"r00", "r01", "r02", "r03"}
    assert result["c"] == {"r07", "r08", "r09"}


def test_roundrobin_respects_subscriptions() -> None:
    """roundrobin: a resource only goes to a member subscribed to it."""
    subscriptions = {"a": Subscription(frozenset({"x", "y"})), "b": Subscription(frozenset({"y", "z"}))}
    result = RoundRobinAssignor().assign(subscriptions)
    assert "x" in result["a"] and "z" in result["b"]


def test_sticky_moves_as_little_as_possible() -> None:
    """sticky: a newcomer takes its share only from members above their quota."""
    before = StickyAssignor().assign(_everyone(["a", "b"]))
    after = StickyAssignor().assign(_everyone(["a", "b", "c"], before))
    moved = sum(len(before[m] - after[m]) for m in ("a", "b"))
    assert moved == len(after["c"]) == 3


def test_cooperative_sticky_withholds_what_another_member_owns() -> None:
    """cooperative-sticky: what moves is revoked from its owner but not yet given to the new one."""
    before = StickyAssignor().assign(_everyone(["a", "b"]))
    first = CooperativeStickyAssignor().assign(_everyone(["a", "b", "c"], before))
    assert first["c"] == frozenset()
    assert first["a"] | first["b"] < RESOURCES
    second = CooperativeStickyAssignor().assign(_everyone(["a", "b", "c"], first))
    assert len(second["c"]) == 3


def test_newest_claim_owns() -> None:
    """Conflicting ownership claims: the newer generation wins."""
    subscriptions = {
        "old": Subscription(RESOURCES, frozenset({"r00"}), 1),
        "new": Subscription(RESOURCES, frozenset({"r00"}), 2),
    }
    assert CooperativeStickyAssignor().assign(subscriptions)["old"].isdisjoint({"r00"})


def test_negotiation_follows_kafka() -> None:
    """Admission needs the type and a common protocol; the protocol most members prefer wins."""
    assert compatible(Offer("t", ("a", "b")), [Offer("t", ("b",))])
    assert not compatible(Offer("t", ("a",)), [Offer("t", ("b",))])
    assert not compatible(Offer("u", ("b",)), [Offer("t", ("b",))])
    offers = {"m1": Offer("t", ("a",)), "m2": Offer("t", ("b",)), "m3": Offer("t", ("a", "b"))}
    assert admit(["m1", "m2", "m3"], offers) == (["m1", "m3"], ["m2"])
    assert choose({"m1": ["x", "p1", "p2"], "m2": ["p2", "p1"], "m3": ["p1", "p2"]}) == "p1"
    assert choose({"m1": ["a"], "m2": ["b"]}) is None


class Simulation:
    """Members that follow their entries honestly, and a steward reconciling after every step."""

    def __init__(self) -> None:
        self.state = GroupState()
        self.live: dict[str, frozenset[str]] = {}
        self.owned: dict[str, frozenset[str]] = {}
        self.acks: dict[str, Ack] = {}
        self.expired: set[str] = set()

    def reconcile(self) -> None:
        self.state = reconcile(self.state, self.live, self.acks, self.expired, StickyAssignor())
        self.expired = set()
        held: list[str] = [r for e in self.state.members.values() for r in e.held]
        assert len(held) == len(set(held)), "a resource is held by two entries"

    def follow(self, member: str) -> None:
        entry = self.state.members.get(member)
        if member not in self.owned:
            return
        wanted = frozenset() if entry is None or entry.state == FENCED else entry.assigned
        self.owned[member] = self.owned[member] & wanted
        for resource in wanted - self.owned[member]:
            assert all(resource not in o for m, o in self.owned.items() if m != member), "owned twice"
        self.owned[member] = wanted
        if entry is not None:
            self.acks[member] = Ack(entry.seq, self.owned[member])

    def join(self, member: str) -> None:
        self.live[member], self.owned[member] = RESOURCES, frozenset()

    def leave(self, member: str, crash: bool) -> None:
        if not crash:
            self.owned[member] = frozenset()
        self.owned.pop(member, None)
        self.live.pop(member, None)
        self.acks.pop(member, None)


OPS = st.lists(
    st.tuples(st.sampled_from(["join", "leave", "crash", "follow", "stall"]), st.sampled_from("abcde")),
    min_size=1,
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(OPS)
def test_reconciliation_never_gives_a_resource_to_two_members(ops: list[tuple[str, str]]) -> None:
    """Any interleaving of joins, leaves, crashes, slow members and fenced members: no resource is
    ever owned by two members, and once everyone follows, the group converges balanced."""
    sim = Simulation()
    for op, member in ops:
        if op == "join" and member not in sim.live:
            sim.join(member)
        elif op in ("leave", "crash") and member in sim.live:
            sim.leave(member, crash=op == "crash")
        elif op == "follow":
            sim.follow(member)
        elif op == "stall" and member in sim.owned and member in sim.state.members:
            sim.owned[member] = frozenset()  # past the rebalance timeout a member has stopped (the contract)
            sim.expired.add(member)
        sim.reconcile()
    for _ in range(12):
        for member in list(sim.live):
            sim.follow(member)
        sim.reconcile()
    if sim.live:
        counts = [len(sim.owned[m]) for m in sim.live]
        assert sum(counts) == len(RESOURCES) and max(counts) - min(counts) <= 1
        assert frozenset().union(*(sim.owned[m] for m in sim.live)) == RESOURCES


def test_a_member_whose_revocation_is_acknowledged_is_not_fenced_late() -> None:
    """The steward judges the rebalance timeout after the member's acknowledgement arrived: the
    member revoked, so it keeps what it kept and is not fenced; one that did not ack is fenced."""
    for acked in (True, False):
        sim = Simulation()
        sim.join("a")
        sim.reconcile()
        sim.follow("a")
        sim.reconcile()
        sim.join("b")
        sim.reconcile()
        entry = sim.state.members["a"]
        assert entry.state == UNREVOKED
        if acked:
            sim.follow("a")
        sim.expired = {"a"}
        sim.reconcile()
        state = sim.state.members["a"].state
        assert (
            (state != FENCED and sim.state.members["a"].assigned == entry.assigned)
            if acked
            else state == FENCED
        )


def test_group_state_round_trips() -> None:
    """The state blob decodes to what was encoded; garbage decodes to None."""
    sim = Simulation()
    for member in "abc":
        sim.join(member)
    sim.reconcile()
    assert GroupState.decode(sim.state.encode()) == sim.state
    assert GroupState.decode(b"not json") is None


class _HalfListener:
    def on_assigned(self, resources: frozenset[str]) -> None:
        pass


def test_resource_arguments_are_checked_before_any_io() -> None:
    """Resource names, listeners and assignors become ConsensusError subclasses, naming the fault."""
    assert resource_names(["a", "b", "a"]) == frozenset({"a", "b"})
    with pytest.raises(InvalidTypeError, match="not one str"):
        resource_names("ab")
    with pytest.raises(InvalidKeyError):
        resource_names(["a/b"])
    with pytest.raises(InvalidTypeError, match=r"lacks on_revoked \(see ResourceListener\)"):
        check_resource_listener(_HalfListener())
    with pytest.raises(InvalidTypeError, match="the handler lacks metadata, on_leave_prepare"):
        require_callbacks(object(), ("metadata", "on_leave_prepare"), "handler", "CoordinatorHandler")
    assert assignor_named("sticky").name == "sticky"
    with pytest.raises(ConfigurationError, match="unknown assignor"):
        assignor_named("no-such-assignor")


class _Owners:
    """A ResourceListener tracking who owns what, failing on a resource started twice."""

    def __init__(self, holders: dict[str, str], name: str) -> None:
        self.holders, self.name = holders, name

    def on_assigned(self, resources: frozenset[str]) -> None:
        for resource in resources:
            assert resource not in self.holders, f"{resource} started by {self.name}, held by {self.holders}"
            self.holders[resource] = self.name

    def on_revoked(self, resources: frozenset[str]) -> None:
        for resource in resources:
            assert self.holders.pop(resource) == self.name


def _rebalance(handlers: Mapping[str, ResourceHandler], generation: int) -> int:
    """Rounds of the group protocol over ``handlers`` (prepare, negotiation, assignment by the first
    member, complete) while a cooperative member revoked something (it asks for a follow-up round
    then); returns the last generation."""
    follow_up = True
    while follow_up:
        follow_up = False
        for name, handler in handlers.items():
            handler.on_join_prepare(generation, name)
        generation += 1
        offers = {name: dict(handler.metadata()) for name, handler in handlers.items()}
        protocol = choose({name: list(offer) for name, offer in offers.items()})
        assert protocol is not None
        leader = next(iter(handlers.values()))
        members = {name: offer[protocol] for name, offer in offers.items()}
        assignment = leader.perform_assignment(next(iter(handlers)), protocol, members)
        for name, handler in handlers.items():
            before = handler.owned
            handler.on_join_complete(generation, name, protocol, assignment[name])
            follow_up |= handler.cooperative and bool(before - handler.owned)
    return generation


def test_kip429_two_bounce_upgrade_keeps_every_resource_owned_once() -> None:
    """["range"] -> ["cooperative-sticky", "range"] -> ["cooperative-sticky"], one member at a time:
    after every restart each resource has exactly one owner, both members own some, none twice."""
    resources = [f"r{i}" for i in range(6)]
    holders: dict[str, str] = {}
    handlers: dict[str, ResourceHandler] = {}
    generation = 0
    for step in [("a", ["range"]), ("b", ["range"])] + [
        (name, assignors)
        for assignors in (["cooperative-sticky", "range"], ["cooperative-sticky"])
        for name in ("a", "b")
    ]:
        name, assignors = step
        if name in handlers:
            handlers.pop(name).on_leave_prepare()
            generation = _rebalance(handlers, generation)
        handlers[name] = ResourceHandler(resources, _Owners(holders, name), assignors=assignors)
        generation = _rebalance(handlers, generation)
        if len(handlers) == 2:
            assert sorted(holders) == resources
            assert all(handler.owned for handler in handlers.values()), holders


def test_static_members_replace_fence_and_keep_for_the_grace() -> None:
    """A restarted static member replaces its predecessor (which completes nothing more); a live
    predecessor is fenced; a gone static member is kept for the grace period, then dropped."""
    done = Completed(4, ("a", "s1"), "p", "a", 7)
    record = GenerationRecord(4, STABLE, ("a", "s1"), completed=done, statics={"s1": "i"})
    static = StaticMembers(grace=10.0)
    offer, offer_i = Offer("t", ("p",)), Offer("t", ("p",), "i")
    gone = static.view(record, {"a": offer}, now=0.0)
    assert gone.kept == ("s1",) and not gone.replaced
    assert static.view(record, {"a": offer}, now=11.0).kept == ()
    back = static.view(record, {"a": offer, "s2": offer_i}, now=1.0)
    assert back.replaced == {"s2": "s1"} and back.fenced == ()
    replaced = replace(record, back)
    assert replaced.members == ("a", "s2") and replaced.aliases == {"s2": "s1"}
    assert replaced.completed is not None and replaced.completed.members == ("a", "s2")
    twice = static.view(record, {"a": offer, "s1": offer_i, "s2": offer_i}, now=1.0)
    assert twice.replaced == {"s2": "s1"} and twice.fenced == ("s1",) and "s1" not in twice.live
