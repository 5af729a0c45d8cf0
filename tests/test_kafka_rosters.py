"""How a Kafka session reads a group's members from the broker's answers (``kafka.rosters``), replayed
from the sequence of DescribeGroups answers a chaos run recorded (issue 40, item 7)."""

from __future__ import annotations

import time
from typing import cast

from consensus_api.config import build_options, parse_url
from consensus_backends.kafka import KafkaBackend
from consensus_backends.kafka import settings as kafka_settings
from consensus_backends.kafka.client import PREPARING, STABLE, Channel, GroupView
from consensus_backends.kafka.protocol import GROUP_TYPE, Entry, Metadata, assign, encode_metadata
from consensus_backends.kafka.records import Command, Op, encode_departures
from consensus_backends.kafka.rosters import Rosters
from consensus_backends.kafka.state import StateMachine

GROUP_ID = "t.members"
#: The Kafka members (one per session) and the member entries each carries in group g0.
Carried = dict[str, list[Entry]]


class Answers:
    """DescribeGroups answered from a recorded sequence, one answer per request."""

    def __init__(self) -> None:
        self.next: list[GroupView] = []

    def describe(self, group_ids: list[str], deadline: float) -> dict[str, GroupView]:
        return {GROUP_ID: self.next.pop(0)}


def _rosters() -> tuple[Rosters, Answers, StateMachine]:
    parsed, query = parse_url("kafka://127.0.0.1:9092/t")
    options = build_options(query, KafkaBackend.options, "kafka", parsed)
    answers, state = Answers(), StateMachine()
    return Rosters(kafka_settings.build(parsed, options), cast(Channel, answers), state), answers, state


def _stable(generation: int, carried: Carried) -> GroupView:
    """A Stable description: each Kafka member's metadata and the group leader's assignment."""
    metadata = {kid: encode_metadata(Metadata(tuple(entries), 0.0)) for kid, entries in carried.items()}
    assignments = assign(generation, metadata.items(), (0, None), election=False)
    return GroupView(STABLE, GROUP_TYPE, {kid: (raw, assignments[kid]) for kid, raw in metadata.items()})


def _rebalancing(kafka_ids: list[str]) -> GroupView:
    """A description during a rebalance: member ids only."""
    return GroupView(PREPARING, GROUP_TYPE, dict.fromkeys(kafka_ids, (b"", b"")))


def _entry(member_id: str, token: str, since: int) -> Entry:
    return Entry(member_id, token, since, float(token), group="g0")


def _read(rosters: Rosters, answers: Answers, view: GroupView) -> list[str]:
    answers.next.append(view)
    return sorted(i for i, _ in rosters.entries(GROUP_ID, "g0", time.monotonic() + 5, settle=False))


def test_an_earlier_description_read_late_hides_no_member() -> None:
    """History 20261128T131918-ef0f25: m2.73's generation (here 42) was Stable for milliseconds
    before m2.74's join from the same session rebalanced the group, and m0.70 left meanwhile. A
    Stable description of the generation before (41) came after the one of 42: the watch's,
    requested earlier and read later on its own thread, a cut-off coordinator's from memory, or the
    new coordinator's from its committed state. It is not used (the watch's fingerprint stays),
    so the re-read after m0.70's departure, which finds the group rebalancing, still answers m2.73
    (it answered [m1.47, m1.68]), as does a read of that earlier description; the next Stable
    generation adds m2.74."""
    rosters, answers, state = _rosters()
    a, b, c = _entry("m1.47", "1", 40), _entry("m1.68", "2", 40), _entry("m0.70", "3", 40)
    before: Carried = {"kafka-1": [a, b], "kafka-0": [c]}
    joined: Carried = {**before, "kafka-2": [_entry("m2.73", "4", 42)]}
    assert _read(rosters, answers, _stable(42, joined)) == ["m0.70", "m1.47", "m1.68", "m2.73"]
    watched = rosters.fingerprint(GROUP_ID, "g0", _stable(42, joined))
    assert rosters.fingerprint(GROUP_ID, "g0", _stable(41, before)) == watched
    state.apply(7, Command(Op.DEPART, "", value=encode_departures([(GROUP_ID, "kafka-0#3")])))
    rebalancing = _rebalancing(["kafka-0", "kafka-1", "kafka-2"])
    assert _read(rosters, answers, rebalancing) == ["m1.47", "m1.68", "m2.73"]
    assert _read(rosters, answers, _stable(41, before)) == ["m1.47", "m1.68", "m2.73"]
    later: Carried = {"kafka-1": [a, b], "kafka-2": [_entry("m2.73", "4", 42), _entry("m2.74", "5", 43)]}
    assert _read(rosters, answers, _stable(43, later)) == ["m1.47", "m1.68", "m2.73", "m2.74"]


def test_a_group_started_again_is_read_at_its_lower_generation() -> None:
    """A group that emptied and was started again counts its generations from the start: its Kafka
    members are all new (an id is never reused), so its roster is read, not held back."""
    rosters, answers, _ = _rosters()
    assert _read(rosters, answers, _stable(42, {"kafka-1": [_entry("m1", "1", 42)]})) == ["m1"]
    assert _read(rosters, answers, _stable(1, {"kafka-9": [_entry("m9", "1", 1)]})) == ["m9"]
