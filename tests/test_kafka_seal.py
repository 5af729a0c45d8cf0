"""The Kafka backend's migration SPI: the seal as a command in the log, the term ceiling as the log's
end offset, session identities; the state machine alone, then against a real broker (each test under a
prefix, so a command-log topic, of its own). The behaviour every backend shares is the conformance
suite's ``migration`` section (consensus_testkit/conformance/test_migration_seal.py)."""

from __future__ import annotations

import threading

import pytest
from kafka_support import Connect

import consensus_api as ca
from consensus_api.backend import Backend
from consensus_backends.kafka.records import Command, Op, decode, encode
from consensus_backends.kafka.state import Result, StateMachine
from consensus_testkit.conformance.helpers import spi, wait_until

WRITERS = 3


def test_state_machine_refuses_storage_commands_between_seal_and_unseal() -> None:
    """After a SEAL every put, update and delete is SEALED whatever its precondition; leases and
    departures go on; after an UNSEAL writes are decided as before; the records round-trip."""
    state = StateMachine()
    lead = ca.Leadership("s", "a", 2)
    results = [
        state.apply(offset, command).outcome.result
        for offset, command in enumerate(
            [
                Command(Op.PUT, "k", b"1"),
                Command(Op.LEAD, "s", candidate="a", member="m-a", term=0),
                Command(Op.SEAL, ""),
                Command(Op.PUT, "j", b"1"),
                Command(Op.UPDATE, "k", b"2", version=1, fence=lead),
                Command(Op.DELETE, "k"),
                Command(Op.PUT, "k", b"exists"),
                Command(Op.UNLEAD, "s", candidate="a", member="m-a", term=2),
                Command(Op.LEAD, "s", candidate="b", member="m-b", term=2),
                Command(Op.DEPART, "", b'[["g", "m"]]'),
                Command(Op.SEAL, ""),
                Command(Op.UNSEAL, ""),
                Command(Op.UPDATE, "k", b"3", version=1),
            ]
        )
    ]
    ok, sealed = Result.OK, Result.SEALED
    assert results == [ok, ok, ok, sealed, sealed, sealed, sealed, ok, ok, ok, ok, ok, ok]
    assert state.get("k") == ca.Versioned(b"3", 13) and state.get("j") is None
    assert state.lease("s").term == 9 and state.departed("g") == frozenset({"m"})
    assert not state.sealed()
    for op in (Op.SEAL, Op.UNSEAL):
        assert decode(*encode(Command(op, "", origin=("sid", 1)))) == Command(op, "", origin=("sid", 1))


def test_seal_holds_for_every_session_and_a_session_opened_later(kafka_connect: Connect) -> None:
    """A seal from one session refuses another's writes; a session opened after it, replaying the log
    from its start, finds the store sealed and the same values; unseal lets all of them write."""
    sealing, writer = kafka_connect(), kafka_connect()
    version = writer.storage.put("a/k", b"before")
    spi(sealing).seal()
    with pytest.raises(ca.SealedError):
        writer.storage.update("a/k", b"after", version=version)
    with pytest.raises(ca.SealedError):
        writer.storage.put("a/other", b"x")
    late = kafka_connect()
    assert spi(late).sealed() and spi(writer).sealed()
    assert late.storage.fetch("a/k") == ca.Versioned(b"before", version)
    assert late.storage.keys("a") == frozenset({"a/k"})
    with pytest.raises(ca.SealedError):
        late.storage.delete("a/k")
    spi(late).unseal()
    assert not spi(sealing).sealed()
    updated = writer.storage.update("a/k", b"after", version=version)
    assert sealing.storage.fetch("a/k") == ca.Versioned(b"after", updated)


def test_every_session_agrees_which_racing_writes_the_seal_refused(kafka_connect: Connect) -> None:
    """Writers race a seal; the writers' own outcomes, and the view of a session opened afterwards that
    rebuilds the state from the log, agree key by key: acknowledged writes present, refused ones absent."""
    sealing = kafka_connect()
    writers = [kafka_connect() for _ in range(WRITERS)]
    outcomes: dict[str, int | None] = {}  # key -> version, or None: refused
    started = threading.Barrier(WRITERS + 1)
    lock = threading.Lock()

    def write(session: ca.Session, index: int) -> None:
        started.wait()
        for count in range(60):
            key = f"race/{index}-{count}"
            try:
                result: int | None = session.storage.put(key, key.encode())
            except ca.SealedError:
                result = None
            with lock:
                outcomes[key] = result

    threads = [threading.Thread(target=write, args=(session, i)) for i, session in enumerate(writers)]
    for thread in threads:
        thread.start()
    started.wait()

    def acknowledged() -> int:
        with lock:
            return sum(version is not None for version in outcomes.values())

    wait_until(lambda: acknowledged() >= 5, 30, what="five writes acknowledged before the seal")
    spi(sealing).seal()
    for thread in threads:
        thread.join(120)
    assert not any(thread.is_alive() for thread in threads)
    assert None in outcomes.values() and any(version is not None for version in outcomes.values())
    late = kafka_connect()
    for key, version in outcomes.items():
        expected = None if version is None else ca.Versioned(key.encode(), version)
        assert late.storage.fetch(key) == expected == writers[0].storage.fetch(key), key


def test_term_ceiling_is_the_end_of_the_log(kafka_connect: Connect) -> None:
    """term_ceiling() is at least every term and version issued (both are log offsets plus one), is the
    same from every session once the log is still, and never goes down."""
    first, second = kafka_connect(), kafka_connect()
    readings = [spi(first).term_ceiling()]
    assert first.election("svc").nominate("c")
    leadership = first.election("svc").leadership()
    assert leadership is not None
    version = second.storage.put("k", b"v")
    readings += [spi(second).term_ceiling(), spi(first).term_ceiling()]
    assert readings[-2] == readings[-1] >= max(leadership.term, version)
    assert readings == sorted(readings)


def test_session_identity_is_the_log_session_id_and_live_sessions_is_none(kafka_connect: Connect) -> None:
    """Each session names itself by its command-log session id; Kafka cannot list live sessions."""
    backends: list[Backend] = [spi(kafka_connect()), spi(kafka_connect())]
    identities = [backend.session_identity() for backend in backends]
    assert len(set(identities)) == 2 and all(len(identity) == 32 for identity in identities)
    assert [backend.live_sessions() for backend in backends] == [None, None]
