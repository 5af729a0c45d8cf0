"""The ZooKeeper backend's layout against a real server: names, versions, values and reads.

Session loss and outages: ``test_zookeeper_faults.py``; configuration, authentication and TLS:
``test_zookeeper_security.py``; fixtures: ``zookeeper_support.py``."""

from __future__ import annotations

import contextlib
import threading
import time

import pytest
from kazoo.client import KazooClient
from zookeeper_support import Connect, server_zxid

import consensus_api as ca
from consensus_api import Versioned
from consensus_backends.zookeeper.layout import _needs_escape, decode_name, encode_name
from consensus_testkit import ServerHandle

MIB = 1024 * 1024


def test_name_encoding_round_trips() -> None:
    """Names with '/', '%', controls and astral characters become valid znode names and come back."""
    for name in ("plain", "a/b", "100%", "%2F", "🔑", "tab\there", "ü-ß é", "\ud800"):
        encoded = encode_name(name)
        assert "/" not in encoded
        assert all(ord(char) < 0xD800 and ord(char) >= 0x20 for char in encoded)
        assert decode_name(encoded) == name


def test_every_character_is_escaped_exactly_when_zookeeper_needs_it() -> None:
    """The fast path (a name with nothing to escape is kept) agrees with the rule for every character."""
    for code in range(0x110000):
        char = chr(code)
        assert (encode_name(char) == char) != _needs_escape(char), hex(code)


def test_versions_are_anchor_zxids_and_rise_across_recreate(
    zk_server: ServerHandle, zk_connect: Connect, zk_raw: KazooClient, zk_chroot: str
) -> None:
    """A version is the anchor's mzxid; delete empties the anchor, so re-created keys get higher versions."""
    storage = zk_connect(zk_server).storage
    versions = [storage.put("k", b"1")]
    for cycle in range(3):
        versions.append(storage.update("k", b"2"))
        storage.delete("k")
        assert zk_raw.exists(f"{zk_chroot}/kv/k:k") is None
        assert zk_raw.get(f"{zk_chroot}/kv/v:k")[0] == b""
        versions.append(storage.put("k", f"c{cycle}".encode()))
        assert zk_raw.get(f"{zk_chroot}/kv/v:k")[1].mzxid == versions[-1]
    assert versions == sorted(set(versions)), versions
    assert storage.fetch("k") == Versioned(b"c2", versions[-1])


def test_stale_version_never_matches_a_recreated_key(zk_server: ServerHandle, zk_connect: Connect) -> None:
    """The znode version of the anchor does not restart, so an old version cannot match again (no ABA)."""
    storage = zk_connect(zk_server).storage
    old = storage.put("k", b"old")
    storage.delete("k")
    storage.put("k", b"new")
    with pytest.raises(ca.VersionConflictError):
        storage.update("k", b"x", version=old)
    with pytest.raises(ca.VersionConflictError):
        storage.delete("k", version=old)


def test_compare_and_set_never_crosses_a_recreate(zk_server: ServerHandle, zk_connect: Connect) -> None:
    """Racing CAS updates against delete + re-create: no update at version v succeeds with a re-create
    (a put returning p, v < p) committed between its expected version and its own new version."""
    recreator, updater = zk_connect(zk_server), zk_connect(zk_server)
    recreator.storage.put("k", b"0")
    puts: list[int] = []
    updates: list[tuple[int, int]] = []
    stop = time.monotonic() + 3

    def recreate() -> None:
        while time.monotonic() < stop:
            with contextlib.suppress(ca.KeyNotFoundError, ca.KeyExistsError):
                recreator.storage.delete("k")
                puts.append(recreator.storage.put("k", b"0"))
            time.sleep(0.005)  # leave the updaters room to succeed now and then

    def compare_and_set() -> None:
        while time.monotonic() < stop:
            current = updater.storage.fetch("k")
            if current is None:
                continue
            with contextlib.suppress(ca.VersionConflictError, ca.KeyNotFoundError):
                updates.append((current.version, updater.storage.update("k", b"1", version=current.version)))

    threads = [
        threading.Thread(target=recreate),
        threading.Thread(target=compare_and_set),
        threading.Thread(target=compare_and_set),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert puts and updates, (len(puts), len(updates))
    crossed = [(v, w) for v, w in updates if any(v < p < w for p in puts)]
    assert not crossed, crossed[:5]


def test_intermediate_znodes_are_not_keys(
    zk_server: ServerHandle, zk_connect: Connect, zk_raw: KazooClient, zk_chroot: str
) -> None:
    """A deep put creates directory znodes only; deleting a parent key keeps the children and vice versa."""
    storage = zk_connect(zk_server).storage
    storage.put("a/b/c", b"deep")
    assert zk_raw.get_children(f"{zk_chroot}/kv") == ["d:a"]
    assert sorted(zk_raw.get_children(f"{zk_chroot}/kv/d:a/d:b")) == ["k:c", "v:c"]
    assert storage.fetch("a") is None and storage.fetch("a/b") is None
    assert storage.keys("") == frozenset() and storage.keys("a") == frozenset()
    parent = storage.put("a", b"parent")
    storage.delete("a/b/c")
    assert storage.fetch("a") == Versioned(b"parent", parent)
    storage.put("a/b/c", b"again")
    storage.delete("a")
    assert storage.keys("") == frozenset()
    assert storage.keys("a/b") == {"a/b/c"}


def test_escaped_key_names_round_trip(zk_server: ServerHandle, zk_connect: Connect) -> None:
    """Keys with '%' and characters ZooKeeper rejects in paths are stored and listed unchanged."""
    storage = zk_connect(zk_server).storage
    names = {"ns/100%", "ns/%41", "ns/🔑", "ns/\U0010fffd"}
    versions = {name: storage.put(name, name.encode()) for name in names}
    assert storage.keys("ns") == names
    for name in names:
        assert storage.fetch(name) == Versioned(name.encode(), versions[name])


def test_large_values_are_chunked_and_collected(
    zk_server: ServerHandle, zk_connect: Connect, zk_raw: KazooClient, zk_chroot: str
) -> None:
    """A 1 MiB value lives in chunk znodes below the anchor; replacing or deleting it removes them."""
    storage = zk_connect(zk_server).storage
    anchor = f"{zk_chroot}/kv/v:big"
    big = bytes(range(256)) * (MIB // 256)
    storage.put("big", big)
    assert len(zk_raw.get_children(anchor)) == 2
    storage.update("big", big[::-1])
    assert len(zk_raw.get_children(anchor)) == 2
    assert storage.fetch("big").value == big[::-1]  # type: ignore[union-attr]
    storage.update("big", b"small")
    assert zk_raw.get_children(anchor) == []
    storage.update("big", big)
    storage.delete("big")
    assert zk_raw.get_children(anchor) == []


def test_large_member_data_round_trips(zk_server: ServerHandle, zk_connect: Connect) -> None:
    """Member data of 1 MiB is stored in ephemeral chunks and read back; leave removes them."""
    group = zk_connect(zk_server).group("g")
    data = bytes(range(256)) * (MIB // 256)
    group.join("m", data)
    assert group.membership() == {"m": data}
    group.leave("m")
    assert group.membership() == {}


def test_fetch_writes_a_quorum_barrier(zk_server: ServerHandle, zk_connect: Connect) -> None:
    """A fetch (and keys, membership, leadership) first commits a no-op write: the zxid advances by one."""
    session = zk_connect(zk_server)
    session.storage.put("k", b"v")
    for read in (
        lambda: session.storage.fetch("k"),
        lambda: session.storage.keys(""),
        lambda: session.group("g").membership(),
        lambda: session.election("e").leadership(),
    ):
        before = server_zxid(zk_server)
        read()
        assert server_zxid(zk_server) == before + 1


def test_a_fenced_write_after_a_quiet_spell_first_commits_a_quorum_barrier(
    zk_server: ServerHandle, zk_connect: Connect
) -> None:
    """While its requests are being answered, a leader's fenced write reads the election from its
    server's copy and commits once; after a third of the session timeout without an answer (a process
    frozen past its session timeout may have lost its session) it first commits a no-op quorum write,
    which fails on an expired session: the zxid advances by two."""
    session = zk_connect(zk_server, session_timeout=4)
    election = session.election("e")
    assert election.nominate("c") is True
    fence = election.leadership()
    assert fence is not None
    session.storage.put("k", b"v")
    before = server_zxid(zk_server)
    session.storage.update("k", b"busy", fence=fence)
    assert server_zxid(zk_server) == before + 1
    time.sleep(4 / 3 + 0.2)
    before = server_zxid(zk_server)
    version = session.storage.update("k", b"quiet", fence=fence)
    assert server_zxid(zk_server) == before + 2
    assert session.storage.fetch("k") == Versioned(b"quiet", version)
