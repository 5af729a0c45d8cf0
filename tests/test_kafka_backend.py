"""The Kafka backend against a real Kafka 4.x KRaft broker: storage (racing conditional writes,
versions, fencing in log order), connection and credentials.

Group membership and election: tests/test_kafka_groups.py. The pure parts (state
machine, record format, group-leader assignment, options): tests/test_kafka_units.py.
Broker faults: tests/test_kafka_broker_faults.py.
"""

from __future__ import annotations

import logging
import socket
import time
import uuid
from functools import partial
from typing import Any

import pytest
from kafka_support import Connect, race

import consensus_api as ca
from consensus_api.config import Secret
from consensus_testkit import ServerHandle

# Storage


def test_racing_conditional_writes_have_one_winner_both_sessions_agree(kafka_connect: Connect) -> None:
    """Two sessions race update(version=v) on one key, 30 times: one wins each race, both read the same."""
    first, second = kafka_connect(), kafka_connect()
    version = first.storage.put("race/k", b"0")
    for round_ in range(30):
        values = (f"a{round_}".encode(), f"b{round_}".encode())
        results = race(
            partial(first.storage.update, "race/k", values[0], version=version),
            partial(second.storage.update, "race/k", values[1], version=version),
        )
        winners = [index for index, result in enumerate(results) if isinstance(result, int)]
        assert len(winners) == 1, results
        [loser] = [result for result in results if not isinstance(result, int)]
        assert isinstance(loser, ca.VersionConflictError)
        version = int(results[winners[0]])  # type: ignore[call-overload]
        expected = ca.Versioned(values[winners[0]], version)
        assert first.storage.fetch("race/k") == expected == second.storage.fetch("race/k")


def test_racing_puts_have_one_winner(kafka_connect: Connect) -> None:
    """Five sessions put one key at once: exactly one version, the others KeyExistsError."""
    sessions = [kafka_connect() for _ in range(5)]
    results = race(*(lambda s=s, i=i: s.storage.put("once", str(i).encode()) for i, s in enumerate(sessions)))
    winners = [index for index, result in enumerate(results) if isinstance(result, int)]
    assert len(winners) == 1, results
    assert all(isinstance(result, ca.KeyExistsError) for result in results if not isinstance(result, int))
    expected = ca.Versioned(str(winners[0]).encode(), int(results[winners[0]]))  # type: ignore[call-overload]
    assert all(session.storage.fetch("once") == expected for session in sessions)


def test_versions_increase_across_delete_and_recreate(kafka_connect: Connect) -> None:
    """Versions are log positions: they rise across updates, delete and re-create; old ones conflict."""
    session, other = kafka_connect(), kafka_connect()
    seen = [session.storage.put("v/k", b"1"), session.storage.update("v/k", b"2")]
    session.storage.delete("v/k")
    other.storage.put("v/unrelated", b"x")
    seen.append(other.storage.put("v/k", b"3"))
    assert seen == sorted(set(seen))
    for stale in seen[:2]:
        with pytest.raises(ca.VersionConflictError):
            session.storage.update("v/k", b"stale", version=stale)
    assert session.storage.fetch("v/k") == ca.Versioned(b"3", seen[-1])


def test_fence_is_decided_in_log_order(kafka_connect: Connect) -> None:
    """A fence checked by a third session (no local knowledge of the candidacy): accepted while the
    lease is current, rejected once the next leader's claim precedes the write in the log."""
    leader, heir, writer = kafka_connect(), kafka_connect(), kafka_connect()
    assert leader.election("svc").nominate("a") is True
    assert heir.election("svc").nominate("b") is False
    old = writer.election("svc").leadership()
    assert old is not None and old.leader_id == "a"
    assert writer.storage.put("f/before", b"ok", fence=old) > 0
    leader.election("svc").resign("a")
    new = writer.election("svc").leadership()
    assert new is not None and new.leader_id == "b" and new.term > old.term
    with pytest.raises(ca.FencedError):
        writer.storage.put("f/after", b"late", fence=old)
    assert writer.storage.fetch("f/after") is None
    assert writer.storage.put("f/after", b"new leader", fence=new) > new.term


def test_big_values_and_a_new_reader_replays_the_log(kafka_connect: Connect) -> None:
    """A 1 MiB value round-trips, and a session opened later rebuilds the same state from the log."""
    session = kafka_connect()
    big = bytes(range(256)) * 4096
    version = session.storage.put("big", big)
    for index in range(20):
        session.storage.put(f"many/{index}", str(index).encode())
    late = kafka_connect()
    assert late.storage.fetch("big") == ca.Versioned(big, version)
    assert late.storage.keys("many") == {f"many/{index}" for index in range(20)}


# Connection, options and credentials


def test_unreachable_broker_raises_backend_unavailable_in_time() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    started = time.monotonic()
    with pytest.raises(ca.BackendUnavailableError):
        ca.connect(f"kafka://127.0.0.1:{port}/x", connect_timeout=1.5)
    # connect_timeout plus slack for a loaded 2-core machine; benchmarks/detection.py times it
    assert time.monotonic() - started < 1.5 + 3


def test_credentials_never_appear_in_errors_reprs_or_logs(kafka_server: ServerHandle, caplog: Any) -> None:
    """The broker has no SASL listener: the SASL handshake is refused at once, as a configuration
    error naming SASL; the password shows up nowhere."""
    secret = "s3cr3t-" + uuid.uuid4().hex
    caplog.set_level(logging.DEBUG)
    url = kafka_server.url.replace("kafka://", f"kafka://alice:{secret}@") + "/cred"
    started = time.monotonic()
    with pytest.raises(ca.ConfigurationError, match="SASL") as raised:
        ca.connect(url, connect_timeout=8)
    assert time.monotonic() - started < 2.0, "a refused SASL handshake must not be retried"
    assert secret not in str(raised.value) and secret not in repr(raised.value)
    assert repr(Secret(secret)) == "'***'"
    assert not [record for record in caplog.records if secret in record.getMessage()]
