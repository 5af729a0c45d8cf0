"""The etcd backend's migration SPI against a real server: the seal (one more compare in each write's
transaction), the term ceiling (a linearizable read's revision) and live sessions (a key per lease).
The behaviour every backend shares is the conformance suite's ``migration`` section
(consensus_testkit/conformance/test_migration_seal.py); these tests look at the keys too."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from seal_support import race_the_seal

import consensus_api as ca
from consensus_api import SessionState, Versioned
from consensus_testkit import ServerHandle
from consensus_testkit.conformance.helpers import EventLog, spi, wait_until
from consensus_testkit.faults import expire_session

WRITERS = 3

Connect = Callable[[], ca.Session]


@pytest.fixture
def connect(etcd_module_server: ServerHandle, etcd_prefix: str) -> Iterator[Connect]:
    """``connect()``: a session below this test's prefix; all closed at teardown."""
    sessions: list[ca.Session] = []

    def factory() -> ca.Session:
        session = ca.connect(
            etcd_module_server.url + etcd_prefix, session_timeout=3, request_timeout=5, connect_timeout=10
        )
        sessions.append(session)
        return session

    yield factory
    for session in sessions:
        session.close()


def _seal_key(etcd_raw: Any, etcd_prefix: str) -> Any:
    """The seal key's metadata as the raw client sees it, or None."""
    _, meta = etcd_raw.get(f"{etcd_prefix}/migration/seal")
    return meta


def test_seal_refuses_another_sessions_writes_until_unsealed(
    connect: Connect, etcd_raw: Any, etcd_prefix: str
) -> None:
    """Put, update (with and without version), delete and a fenced write of another session are refused
    and change nothing; sealing twice writes nothing more; the seal key is no stored key; after unseal
    (twice) every session writes again."""
    sealing, writer = connect(), connect()
    assert writer.election("svc").nominate("c")
    fence = writer.election("svc").leadership()
    version = writer.storage.put("a/k", b"before")
    assert _seal_key(etcd_raw, etcd_prefix) is None and not spi(writer).sealed()
    spi(sealing).seal()
    sealed_at = _seal_key(etcd_raw, etcd_prefix).mod_revision
    spi(sealing).seal()
    assert _seal_key(etcd_raw, etcd_prefix).mod_revision == sealed_at
    for write in (
        lambda: writer.storage.put("a/new", b"x"),
        lambda: writer.storage.put("a/k", b"exists too"),
        lambda: writer.storage.update("a/k", b"after", version=version),
        lambda: writer.storage.update("a/k", b"after", version=version + 1),
        lambda: writer.storage.update("a/k", b"after", fence=fence),
        lambda: writer.storage.delete("a/k"),
        lambda: writer.storage.delete("a/missing"),
    ):
        with pytest.raises(ca.SealedError):
            write()
    assert writer.storage.fetch("a/k") == Versioned(b"before", version)
    assert writer.storage.keys("a") == frozenset({"a/k"}) and writer.storage.keys("") == frozenset()
    assert spi(writer).sealed() and spi(sealing).sealed()
    spi(writer).unseal()
    spi(writer).unseal()
    assert _seal_key(etcd_raw, etcd_prefix) is None and not spi(sealing).sealed()
    updated = writer.storage.update("a/k", b"after", version=version, fence=fence)
    assert sealing.storage.fetch("a/k") == Versioned(b"after", updated)


def test_writers_racing_the_seal_are_applied_before_it_or_refused(connect: Connect) -> None:
    """Sessions put fresh keys and update their own while another seals: every acknowledged write is
    there with its version, every refused one is not, every write begun after seal() returned is
    refused (``seal_support.race_the_seal``)."""
    race_the_seal(connect(), [connect() for _ in range(WRITERS)], connect)


def test_term_ceiling_is_above_every_term_and_token_and_rises(
    connect: Connect, etcd_raw: Any, etcd_prefix: str
) -> None:
    """term_ceiling() is at least a fresh election's term and a lock's token issued by another session,
    at least the revision of any write before it, and never goes down."""
    issuer, reader = connect(), connect()
    readings = [spi(reader).term_ceiling()]
    assert issuer.election("svc").nominate("c")
    leadership = issuer.election("svc").leadership()
    assert leadership is not None
    lease = issuer.lock("lk").acquire(timeout=10)
    assert lease is not None
    readings.append(spi(reader).term_ceiling())
    assert readings[-1] >= max(leadership.term, lease.token) > readings[0]
    written = etcd_raw.put(f"{etcd_prefix}-elsewhere", b"x").header.revision
    spi(issuer).seal()
    readings += [spi(issuer).term_ceiling(), spi(reader).term_ceiling()]
    assert readings[-2] > written
    assert readings == sorted(readings)
    assert all(0 < reading < 2**63 for reading in readings)


def test_live_sessions_lists_each_lease_until_it_ends(
    connect: Connect, etcd_raw: Any, etcd_prefix: str
) -> None:
    """Each session's identity is its lease id in hex, the name of a key bound to that lease; a closed
    session's is gone when close returns; a session whose lease etcd revoked gets a new lease, listed
    under its new id."""
    first, second = connect(), connect()
    ids = [spi(first).session_identity(), spi(second).session_identity()]
    assert spi(second).live_sessions() == frozenset(ids)
    for identity in ids:
        _, meta = etcd_raw.get(f"{etcd_prefix}/migration/sessions/{identity}")
        assert meta.lease_id == int(identity, 16)
    second.close()
    assert spi(first).live_sessions() == frozenset(ids[:1])
    states: EventLog[SessionState] = EventLog("state")
    first.add_state_listener(states)
    expire_session(first)
    states.wait_for(lambda state: state is SessionState.CONNECTED, 30)
    renewed = spi(first).session_identity()
    assert renewed != ids[0]
    wait_until(
        lambda: spi(first).live_sessions() == frozenset({renewed}), 30, what="the new lease listed alone"
    )
