"""The Kafka backend's pure parts, without a broker: the state machine, the record format, the
group leader's assignment and the size of what the broker stores per member, URL and security
options. The broker-backed tests are in tests/test_kafka_backend.py."""

from __future__ import annotations

import logging
import ssl
import uuid
from pathlib import Path
from typing import Any

import pytest

import consensus_api as ca
from consensus_api.config import build_options, parse_url
from consensus_backends.kafka import KafkaBackend
from consensus_backends.kafka import settings as kafka_settings
from consensus_backends.kafka.client import GroupView
from consensus_backends.kafka.protocol import (
    GROUP_TYPE,
    Entry,
    Metadata,
    Roster,
    assign,
    decode_assignment,
    decode_metadata,
    encode_metadata,
)
from consensus_backends.kafka.records import Command, Op, decode, encode
from consensus_backends.kafka.state import Result, StateMachine
from consensus_testkit.certificates import write_certificates


def test_state_machine_orders_leases_and_fences() -> None:
    """The pure state machine: a claim must name the term it replaces; fences match the lease in force."""
    state = StateMachine()

    def apply(offset: int, command: Command) -> Result:
        return state.apply(offset, command)[0].result

    first = ca.Leadership("s", "a", 1)
    assert apply(0, Command(Op.LEAD, "s", candidate="a", member="m-a", term=0)) is Result.OK
    assert apply(1, Command(Op.PUT, "k", b"1", fence=first)) is Result.OK
    assert apply(2, Command(Op.LEAD, "s", candidate="c", member="m-c", term=0)) is Result.REJECTED
    assert apply(3, Command(Op.LEAD, "s", candidate="b", member="m-b", term=1)) is Result.OK
    assert apply(4, Command(Op.UPDATE, "k", b"2", fence=first)) is Result.FENCED
    assert apply(5, Command(Op.UPDATE, "k", b"2", fence=ca.Leadership("s", "b", 4))) is Result.OK
    assert apply(6, Command(Op.UNLEAD, "s", candidate="b", member="m-b", term=4)) is Result.OK
    assert apply(7, Command(Op.DELETE, "k", fence=ca.Leadership("s", "b", 4))) is Result.FENCED
    assert state.get("k") == ca.Versioned(b"2", 6)
    assert apply(8, Command(Op.LEAD, "s", candidate="a", member="m-a2", term=4)) is Result.OK
    assert state.lease("s").term == 9


def test_record_round_trip_and_foreign_records_are_skipped() -> None:
    command = Command(
        Op.UPDATE, "ключ/🔑", b"\x00\xff", version=7, fence=ca.Leadership("s/x", "l", 3), origin=("sid", 5)
    )
    assert decode(*encode(command)) == command
    assert decode([("op", b"put")], b"x") is None
    assert decode([("ca", b"1"), ("op", b"bogus"), ("k", b"k")], b"") is None


def test_assignment_resolves_duplicates_and_keeps_the_queue() -> None:
    """The group leader's decision: the earliest-accepted duplicate wins, the lease holder stays leader,
    members that saw the newest generation keep their order, newcomers queue by join time, and the
    claim names the newest lease term."""

    def meta(own_id: str, at: float, **extra: Any) -> bytes:
        entry = Entry(own_id, "1", extra.get("since", -1), at)
        return encode_metadata(Metadata((entry,), at, **extra))

    members = [
        ("k1", meta("x", 5.0)),
        ("k2", meta("x", 9.0, since=3)),
        ("k3", meta("y", 1.0)),
        ("k4", meta("z", 2.0, seen=3, rank=0, lease=(17, "k2"))),
        ("k5", meta("w", 0.5, seen=3, rank=1)),
        ("k6", meta("v", 0.1, seen=2, rank=0)),
    ]
    result = {
        kid: decode_assignment(raw) for kid, raw in assign(4, members, (12, None), election=True).items()
    }
    assert {kid for kid, a in result.items() if a is not None and a.accepted} == {
        "k2",
        "k3",
        "k4",
        "k5",
        "k6",
    }
    assert result["k1"] is not None and not result["k1"].accepted
    assert all(
        a is not None and a.generation == 4 and a.leader == "k2" and a.prev == 17 for a in result.values()
    )
    queue = sorted((a.rank, kid) for kid, a in result.items() if a is not None and a.accepted)
    assert [kid for _, kid in queue] == ["k2", "k4", "k5", "k6", "k3"]


def test_assignments_and_metadata_do_not_grow_with_the_group() -> None:
    """What the broker stores per member is the same size in a group of 10 and of 1,000 members."""

    def largest(size: int) -> int:
        members = [
            (f"consensus-api-{i:04}-{uuid.uuid4()}", encode_metadata(Metadata((Entry(f"m{i}", "1"),), i)))
            for i in range(size)
        ]
        assignments = assign(7, members, (0, None), election=False)
        return max(len(raw) for raw in [*assignments.values(), *(raw for _, raw in members)])

    assert largest(1000) <= largest(10) + 8 < 200


def test_one_kafka_member_carries_many_entries() -> None:
    """A session's members of a group ride on one Kafka member: each costs one compact entry; the
    leader rejects the later of two entries with one id, the roster drops rejected and departed
    entries."""
    first = [Entry(f"m{i}", str(i), since=2, at=float(i), data=b"d%d" % i) for i in range(1000)]
    raw_first = encode_metadata(Metadata(tuple(first), 0.0))
    assert len(raw_first) < 1000 * 50
    decoded = decode_metadata(raw_first)
    assert decoded is not None and decoded.entries == tuple(first)
    second = encode_metadata(Metadata((Entry("m5", "9", at=0.0), Entry("new", "10", at=5.0)), 1.0))
    raw = assign(3, [("k1", raw_first), ("k2", second)], (0, None), election=False)
    verdicts = {kid: decode_assignment(value) for kid, value in raw.items()}
    assert verdicts["k1"] is not None and verdicts["k1"].accepted and not verdicts["k1"].rejected
    assert verdicts["k2"] is not None and verdicts["k2"].accepted and verdicts["k2"].rejected == {"9"}
    view = GroupView("Stable", GROUP_TYPE, {"k1": (raw_first, raw["k1"]), "k2": (second, raw["k2"])})
    roster = Roster.of("g", view)
    present = roster.present("", {"k1", "k2"}, frozenset({"k1#7"}))
    assert len(present) == 1000 and "m7" not in present and present["new"] == b""
    assert present["m5"] == b"d5"
    assert roster.present("other", {"k1", "k2"}) == {}


def test_one_kafka_member_carries_the_members_of_many_groups() -> None:
    """Entries of every group share one Kafka member: ids are unique per group (one id in two groups
    is no duplicate), the roster answers for one group only, and a group's name is sent once."""
    first = [Entry(f"m{i % 5}", str(i), since=2, at=float(i), group=f"g{i // 5}") for i in range(500)]
    raw_first = encode_metadata(Metadata(tuple(first), 0.0))
    assert raw_first.count(b'"g7"') == 1
    decoded = decode_metadata(raw_first)
    assert decoded is not None and decoded.entries == tuple(first)
    second = encode_metadata(
        Metadata((Entry("m1", "a", at=0.0, group="g3"), Entry("m1", "b", at=0.0, group="new")), 1.0)
    )
    raw = assign(3, [("k1", raw_first), ("k2", second)], (0, None), election=False)
    verdicts = {kid: decode_assignment(value) for kid, value in raw.items()}
    assert verdicts["k1"] is not None and not verdicts["k1"].rejected
    assert verdicts["k2"] is not None and verdicts["k2"].accepted and verdicts["k2"].rejected == {"a"}
    view = GroupView("Stable", GROUP_TYPE, {"k1": (raw_first, raw["k1"]), "k2": (second, raw["k2"])})
    roster = Roster.of("members", view)
    assert roster.present("g3", {"k1", "k2"}) == {f"m{i}": b"" for i in range(5)}
    assert roster.present("new", {"k1", "k2"}) == {"m1": b""}
    assert roster.tokens("g3", {"k1", "k2"}, frozenset({"k1#16"})) == {f"k1#{i}" for i in (15, 17, 18, 19)}


@pytest.mark.parametrize(
    ("url", "options"),
    [
        ("kafka:///prefix", {}),
        ("kafka://127.0.0.1:9092/bad prefix!", {}),
        ("kafka://127.0.0.1:9092/p", {"security_protocol": "SASL_SSL"}),
        ("kafka://127.0.0.1:9092/p", {"ssl_cafile": __file__, "tls_ca": __file__}),
        ("kafka://:pw@127.0.0.1:9092/p", {}),
        ("kafka://127.0.0.1:9092/p", {"sasl_mechanism": "GSSAPI"}),
    ],
)
def test_bad_urls_and_options_raise_configuration_error(url: str, options: dict[str, Any]) -> None:
    with pytest.raises(ca.ConfigurationError):
        ca.connect(url, **options)


def _security_of(url: str, **options: Any) -> dict[str, Any]:
    parsed, query = parse_url(url)
    built = build_options({**query, **options}, KafkaBackend.options, "kafka", parsed)
    return dict(kafka_settings.build(parsed, built).security)


def test_security_options_map_to_kafka_python(caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    """Credentials alone: SASL_PLAINTEXT with SCRAM-SHA-512 and a warning (never PLAIN silently); with TLS:
    SASL_SSL, our verifying context; kafka-python's names are aliases of the common ones."""
    caplog.set_level(logging.WARNING)
    plain = _security_of("kafka://alice:pw@127.0.0.1:9092/p")
    assert (plain["security_protocol"], plain["sasl_mechanism"]) == ("SASL_PLAINTEXT", "SCRAM-SHA-512")
    assert [r.getMessage() for r in caplog.records] == [
        "kafka: credentials are sent without TLS (set tls=true to encrypt them)"
    ]
    secured = _security_of("kafka://alice:pw@127.0.0.1:9092/p", tls=True)
    assert secured["security_protocol"] == "SASL_SSL"
    assert secured["ssl_context"].check_hostname and secured["ssl_context"].verify_mode == ssl.CERT_REQUIRED
    ca_file = write_certificates(tmp_path) / "ca.pem"
    aliased = _security_of(
        "kafka://127.0.0.1:9092/p",
        ssl_cafile=str(ca_file),
        sasl_username="bob",
        sasl_password="pw",
        sasl_mechanism="PLAIN",
    )
    assert (aliased["security_protocol"], aliased["sasl_mechanism"]) == ("SASL_SSL", "PLAIN")
    assert aliased["sasl_plain_username"] == "bob" and repr(aliased["sasl_plain_password"]) == "'***'"
    assert _security_of("kafka://127.0.0.1:9092/p") == {"security_protocol": "PLAINTEXT"}
