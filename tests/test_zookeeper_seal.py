"""The ZooKeeper backend's migration SPI against a real server: the seal (a version check inside each
write's multi), the term ceiling (a write's zxid) and live sessions (an ephemeral znode per session).
The behaviour every backend shares is the conformance suite's ``migration`` section
(consensus_testkit/conformance/test_migration_seal.py); these tests look at the znodes too."""

from __future__ import annotations

import pytest
from kazoo.client import KazooClient
from seal_support import race_the_seal
from zookeeper_support import Connect, state_log

import consensus_api as ca
from consensus_api import SessionState, Versioned
from consensus_testkit import ServerHandle
from consensus_testkit.conformance.helpers import spi, wait_until
from consensus_testkit.faults import expire_session

WRITERS = 3
LARGE = b"x" * (1024 * 1024)  # stored in chunks below the anchor


def test_seal_refuses_another_sessions_writes_until_unsealed(
    zk_server: ServerHandle, zk_connect: Connect, zk_raw: KazooClient, zk_chroot: str
) -> None:
    """A session that wrote before the seal (so knows the unsealed version) has put, update, delete and
    a chunked put refused, nothing of them applied and no chunk left behind; after unseal it writes."""
    sealing, writer = zk_connect(zk_server), zk_connect(zk_server)
    version = writer.storage.put("a/k", b"before")
    spi(sealing).seal()
    assert zk_raw.get(f"{zk_chroot}/migration/seal")[0] == b"sealed"
    for write in (
        lambda: writer.storage.put("a/new", b"x"),
        lambda: writer.storage.put("a/large", LARGE),
        lambda: writer.storage.update("a/k", b"after", version=version),
        lambda: writer.storage.update("a/k", LARGE),
        lambda: writer.storage.delete("a/k"),
    ):
        with pytest.raises(ca.SealedError):
            write()
    assert writer.storage.fetch("a/k") == Versioned(b"before", version)
    assert writer.storage.keys("a") == frozenset({"a/k"})
    anchors = zk_raw.get_children(f"{zk_chroot}/kv/d:a")
    assert all(zk_raw.get_children(f"{zk_chroot}/kv/d:a/{name}") == [] for name in anchors if "v:" in name)
    assert spi(writer).sealed() and spi(sealing).sealed()
    spi(writer).unseal()
    assert not spi(sealing).sealed()
    updated = writer.storage.update("a/k", b"after", version=version)
    assert sealing.storage.put("a/large", LARGE) > updated
    assert sealing.storage.fetch("a/k") == Versioned(b"after", updated)


def test_a_store_without_the_seal_znode_is_unsealed_and_writable(
    zk_server: ServerHandle, zk_connect: Connect, zk_raw: KazooClient, zk_chroot: str
) -> None:
    """A store an earlier version created has no ``migration`` znodes: a session opening it creates
    them; one that finds the seal znode gone under it (its cached version stale) writes on."""
    zk_raw.ensure_path(f"{zk_chroot}/kv")
    zk_raw.create(f"{zk_chroot}/kv/k:old")
    zk_raw.create(f"{zk_chroot}/kv/v:old", b"\x00from before")  # an inline value (``payload``)
    session = zk_connect(zk_server)
    assert zk_raw.get(f"{zk_chroot}/migration/seal")[0] == b""
    assert session.storage.fetch("old") is not None
    assert not spi(session).sealed()
    session.storage.put("k", b"1")
    zk_raw.delete(f"{zk_chroot}/migration/seal")
    assert session.storage.update("k", b"2") > 0
    assert zk_raw.exists(f"{zk_chroot}/migration/seal") is not None
    zk_raw.delete(f"{zk_chroot}/migration/seal")
    assert not spi(session).sealed()
    spi(session).seal()
    with pytest.raises(ca.SealedError):
        session.storage.put("other", b"x")


def test_writers_racing_the_seal_are_applied_before_it_or_refused(
    zk_server: ServerHandle, zk_connect: Connect
) -> None:
    """Sessions put fresh keys and update their own while another seals: every acknowledged write is
    there with its version, every refused one is not, every write begun after seal() returned is
    refused (``seal_support.race_the_seal``)."""
    writers = [zk_connect(zk_server) for _ in range(WRITERS)]
    race_the_seal(zk_connect(zk_server), writers, lambda: zk_connect(zk_server))


def test_term_ceiling_is_above_every_term_and_token_and_rises(
    zk_server: ServerHandle, zk_connect: Connect, zk_raw: KazooClient, zk_chroot: str
) -> None:
    """term_ceiling() is the zxid of a write: above a fresh election's czxid and a lock's token issued
    by another session, rising across calls, from any session, sealed or not."""
    issuer, reader = zk_connect(zk_server), zk_connect(zk_server)
    readings = [spi(reader).term_ceiling()]
    assert issuer.election("svc").nominate("c")
    leadership = issuer.election("svc").leadership()
    assert leadership is not None
    lease = issuer.lock("lk").acquire(timeout=10)
    assert lease is not None
    readings.append(spi(reader).term_ceiling())
    assert readings[-1] > max(leadership.term, lease.token) > readings[0]
    spi(issuer).seal()
    readings += [spi(issuer).term_ceiling(), spi(reader).term_ceiling()]
    assert readings == sorted(set(readings))
    assert readings[-1] == zk_raw.exists(f"{zk_chroot}/migration").mzxid
    assert all(0 < reading < 2**63 for reading in readings)


def test_live_sessions_lists_each_session_by_its_znode_until_it_ends(
    zk_server: ServerHandle, zk_connect: Connect, zk_raw: KazooClient, zk_chroot: str
) -> None:
    """Each session's identity is its session id in hex and the name of its ephemeral znode; a closed
    session's is gone when close returns; a session expired on the server is replaced by a new one,
    listed under its new id."""
    first, second = zk_connect(zk_server), zk_connect(zk_server)
    ids = [spi(first).session_identity(), spi(second).session_identity()]
    assert spi(first).live_sessions() == frozenset(ids)
    for identity in ids:
        assert zk_raw.exists(f"{zk_chroot}/migration/sessions/{identity}").ephemeralOwner == int(identity, 16)
    second.close()
    assert spi(first).live_sessions() == frozenset(ids[:1])
    states = state_log(first)
    expire_session(first)
    states.wait_for(lambda state: state is SessionState.CONNECTED, 30)
    renewed = spi(first).session_identity()
    assert renewed != ids[0]
    wait_until(
        lambda: spi(first).live_sessions() == frozenset({renewed}), 30, what="the new session listed alone"
    )
