"""The ZooKeeper backend against real ZooKeeper servers: layout, versions, faults, auth and TLS."""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

import pytest
from kazoo.client import KazooClient

import consensus_api as ca
from consensus_api import (
    ConfigurationError,
    FencedError,
    LeaderChanged,
    MembershipChanged,
    OperationTimeoutError,
    Session,
    SessionState,
    ValueChanged,
    Versioned,
)
from consensus_api.conformance.helpers import EventLog, wait_until
from consensus_api.testing import ServerHandle, start_server
from consensus_api.testing._host import HOST, free_port, tcp_request
from consensus_api.testing.certificates import Impostor
from consensus_backends.zookeeper import ZooKeeperBackend
from consensus_backends.zookeeper.paths import _needs_escape, decode_name, encode_name
from consensus_backends.zookeeper.profile import expire_zookeeper_session

MIB = 1024 * 1024
JAVA = Path("/usr/share/java")

Connect = Callable[..., Session]


@pytest.fixture(scope="module")
def server() -> Iterator[ServerHandle]:
    """One ZooKeeper server for the tests that do not disturb it."""
    with start_server("zookeeper") as handle:
        yield handle


@pytest.fixture
def own_server() -> Iterator[ServerHandle]:
    """A ZooKeeper server for one test that kills, pauses or restarts it."""
    with start_server("zookeeper") as handle:
        yield handle


@pytest.fixture
def chroot() -> str:
    """A chroot no other test uses."""
    return f"/zk-test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def connect(chroot: str) -> Iterator[Connect]:
    """``connect(server, **options)``: a session below this test's chroot; all closed at teardown."""
    sessions: list[Session] = []

    def factory(handle: ServerHandle, **options: Any) -> Session:
        settings = {"session_timeout": 4, "request_timeout": 5, "connect_timeout": 10, **options}
        session = ca.connect(handle.url + chroot, **settings)
        sessions.append(session)
        return session

    yield factory
    for session in sessions:
        session.close()


@pytest.fixture
def raw(server: ServerHandle) -> Iterator[KazooClient]:
    """A plain kazoo client to look at the znodes the backend wrote."""
    client = KazooClient(hosts=f"{HOST}:{server.port}")
    client.start(10)
    yield client
    client.stop()
    client.close()


def _kazoo(session: Session) -> KazooClient:
    backend = session._backend
    assert isinstance(backend, ZooKeeperBackend)
    client: KazooClient = backend._connection.client
    return client


def _session_id(session: Session) -> int:
    client_id = _kazoo(session).client_id
    assert client_id is not None
    return int(client_id[0])


def _server_zxid(handle: ServerHandle) -> int:
    match = re.search(rb"Zxid: (0x[0-9a-f]+)", tcp_request(handle.port, b"srvr"))
    assert match is not None
    return int(match.group(1), 16)


def _states(session: Session) -> EventLog[SessionState]:
    log: EventLog[SessionState] = EventLog("state")
    session.add_state_listener(log)
    return log


# Layout, versions and values


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
    server: ServerHandle, connect: Connect, raw: KazooClient, chroot: str
) -> None:
    """A version is the anchor's mzxid; delete empties the anchor, so re-created keys get higher versions."""
    storage = connect(server).storage
    versions = [storage.put("k", b"1")]
    for cycle in range(3):
        versions.append(storage.update("k", b"2"))
        storage.delete("k")
        assert raw.exists(f"{chroot}/kv/k:k") is None
        assert raw.get(f"{chroot}/kv/v:k")[0] == b""
        versions.append(storage.put("k", f"c{cycle}".encode()))
        assert raw.get(f"{chroot}/kv/v:k")[1].mzxid == versions[-1]
    assert versions == sorted(set(versions)), versions
    assert storage.fetch("k") == Versioned(b"c2", versions[-1])


def test_stale_version_never_matches_a_recreated_key(server: ServerHandle, connect: Connect) -> None:
    """The znode version of the anchor does not restart, so an old version cannot match again (no ABA)."""
    storage = connect(server).storage
    old = storage.put("k", b"old")
    storage.delete("k")
    storage.put("k", b"new")
    with pytest.raises(ca.VersionConflictError):
        storage.update("k", b"x", version=old)
    with pytest.raises(ca.VersionConflictError):
        storage.delete("k", version=old)


def test_compare_and_set_never_crosses_a_recreate(server: ServerHandle, connect: Connect) -> None:
    """Racing CAS updates against delete + re-create: no update at version v succeeds with a re-create
    (a put returning p, v < p) committed between its expected version and its own new version."""
    recreator, updater = connect(server), connect(server)
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
    server: ServerHandle, connect: Connect, raw: KazooClient, chroot: str
) -> None:
    """A deep put creates directory znodes only; deleting a parent key keeps the children and vice versa."""
    storage = connect(server).storage
    storage.put("a/b/c", b"deep")
    assert raw.get_children(f"{chroot}/kv") == ["d:a"]
    assert sorted(raw.get_children(f"{chroot}/kv/d:a/d:b")) == ["k:c", "v:c"]
    assert storage.fetch("a") is None and storage.fetch("a/b") is None
    assert storage.keys("") == frozenset() and storage.keys("a") == frozenset()
    parent = storage.put("a", b"parent")
    storage.delete("a/b/c")
    assert storage.fetch("a") == Versioned(b"parent", parent)
    storage.put("a/b/c", b"again")
    storage.delete("a")
    assert storage.keys("") == frozenset()
    assert storage.keys("a/b") == {"a/b/c"}


def test_escaped_key_names_round_trip(server: ServerHandle, connect: Connect) -> None:
    """Keys with '%' and characters ZooKeeper rejects in paths are stored and listed unchanged."""
    storage = connect(server).storage
    names = {"ns/100%", "ns/%41", "ns/🔑", "ns/\U0010fffd"}
    versions = {name: storage.put(name, name.encode()) for name in names}
    assert storage.keys("ns") == names
    for name in names:
        assert storage.fetch(name) == Versioned(name.encode(), versions[name])


def test_large_values_are_chunked_and_collected(
    server: ServerHandle, connect: Connect, raw: KazooClient, chroot: str
) -> None:
    """A 1 MiB value lives in chunk znodes below the anchor; replacing or deleting it removes them."""
    storage = connect(server).storage
    anchor = f"{chroot}/kv/v:big"
    big = bytes(range(256)) * (MIB // 256)
    storage.put("big", big)
    assert len(raw.get_children(anchor)) == 2
    storage.update("big", big[::-1])
    assert len(raw.get_children(anchor)) == 2
    assert storage.fetch("big").value == big[::-1]  # type: ignore[union-attr]
    storage.update("big", b"small")
    assert raw.get_children(anchor) == []
    storage.update("big", big)
    storage.delete("big")
    assert raw.get_children(anchor) == []


def test_large_member_data_round_trips(server: ServerHandle, connect: Connect) -> None:
    """Member data of 1 MiB is stored in ephemeral chunks and read back; leave removes them."""
    group = connect(server).group("g")
    data = bytes(range(256)) * (MIB // 256)
    group.join("m", data)
    assert group.membership() == {"m": data}
    group.leave("m")
    assert group.membership() == {}


def test_fetch_writes_a_quorum_barrier(server: ServerHandle, connect: Connect) -> None:
    """A fetch (and keys, membership, leadership) first commits a no-op write: the zxid advances by one."""
    session = connect(server)
    session.storage.put("k", b"v")
    for read in (
        lambda: session.storage.fetch("k"),
        lambda: session.storage.keys(""),
        lambda: session.group("g").membership(),
        lambda: session.election("e").leadership(),
    ):
        before = _server_zxid(server)
        read()
        assert _server_zxid(server) == before + 1


# Session loss, outages and fencing


def test_real_session_expiry_reports_lost_then_rejoins(server: ServerHandle, connect: Connect) -> None:
    """A server-side expiry: LOST then CONNECTED, the old leader is told first, members are re-joined,
    listeners converge and the old leadership is fenced."""
    victim, observer = connect(server), connect(server)
    states = _states(victim)
    victim.group("g").join("victim", b"v")
    assert victim.election("e").nominate("a") is True
    old = victim.election("e").leadership()
    assert old is not None
    assert observer.election("e").nominate("b") is False
    leaders: EventLog[LeaderChanged] = EventLog("leader")
    values: EventLog[ValueChanged] = EventLog("value")
    victim.election("e").add_listener(leaders)
    victim.listeners.add_value_listener("shared", values)
    leaders.wait_for(lambda event: event.leader_id == "a")
    values.wait_count(1)
    mark, old_session = len(leaders), _session_id(victim)

    session_id, password = _kazoo(victim).client_id
    expire_zookeeper_session(f"{HOST}:{server.port}", session_id, password)
    lost = states.wait_index(lambda state: state is SessionState.LOST, what="LOST")
    states.wait_index(lambda state: state is SessionState.CONNECTED, since=lost, what="CONNECTED")
    assert _session_id(victim) != old_session
    assert leaders.wait_count(mark + 1)[mark] == LeaderChanged("e", None, None)

    version = observer.storage.put("shared", b"after")
    values.wait_last(lambda event: event == ValueChanged("shared", b"after", version), what="convergence")
    wait_until(lambda: observer.group("g").membership() == {"victim": b"v"}, what="the victim re-joined")
    current = leaders.wait_last(lambda event: event.leader_id == "b", what="b leads")
    assert current.term is not None and current.term > old.term
    with pytest.raises(FencedError):
        victim.storage.put("fenced", b"x", fence=old)
    assert observer.storage.fetch("fenced") is None


def test_server_restart_keeps_the_session(own_server: ServerHandle, connect: Connect) -> None:
    """kill + restart within session_timeout: SUSPENDED then CONNECTED on the same session, ephemerals
    kept, and watches re-armed so that listeners converge."""
    watcher = connect(own_server, session_timeout=20, request_timeout=4)
    states = _states(watcher)
    watcher.group("g").join("m", b"kept")
    session_id = _session_id(watcher)
    values: EventLog[ValueChanged] = EventLog("value")
    members: EventLog[MembershipChanged] = EventLog("members")
    watcher.listeners.add_value_listener("k", values)
    watcher.group("g").add_listener(members)
    values.wait_count(1)
    members.wait_count(1)

    own_server.kill()
    suspended = states.wait_index(lambda state: state is SessionState.SUSPENDED, what="SUSPENDED")
    own_server.restart()
    states.wait_index(lambda state: state is SessionState.CONNECTED, since=suspended, what="CONNECTED")
    assert SessionState.LOST not in states.events
    assert _session_id(watcher) == session_id

    writer = connect(own_server)
    version = writer.storage.put("k", b"after restart")
    writer.group("g").join("w", b"writer")
    values.wait_last(lambda event: event == ValueChanged("k", b"after restart", version), what="value")
    members.wait_last(lambda event: dict(event.members) == {"m": b"kept", "w": b"writer"}, what="members")


def test_long_outage_presumes_the_session_lost(own_server: ServerHandle, connect: Connect) -> None:
    """Disconnected longer than session_timeout: LOST is reported during the outage; when the server
    comes back and resumes the old session, it is closed and a new one re-joins everything."""
    session = connect(own_server, session_timeout=2, request_timeout=5)
    states = _states(session)
    session.group("g").join("m", b"x")
    assert session.election("e").nominate("c") is True
    old = session.election("e").leadership()
    old_session = _session_id(session)
    leaders: EventLog[LeaderChanged] = EventLog("leader")
    session.election("e").add_listener(leaders)
    leaders.wait_for(lambda event: event.leader_id == "c")
    mark = len(leaders)

    own_server.kill()
    lost = states.wait_index(lambda state: state is SessionState.LOST, 10, what="LOST while down")
    assert leaders.wait_count(mark + 1)[mark] == LeaderChanged("e", None, None)
    own_server.restart()
    states.wait_index(lambda state: state is SessionState.CONNECTED, since=lost, what="CONNECTED")
    assert _session_id(session) != old_session
    current = leaders.wait_last(lambda event: event.leader_id == "c", what="c leads again")
    assert old is not None and current.term is not None and current.term > old.term
    assert session.group("g").membership() == {"m": b"x"}
    with pytest.raises(FencedError):
        session.storage.put("fenced", b"x", fence=old)


def test_paused_server_reports_lost_then_recovers(own_server: ServerHandle, connect: Connect) -> None:
    """A frozen server: SUSPENDED, then LOST after session_timeout; after SIGCONT a new session re-joins."""
    session = connect(own_server, session_timeout=2, request_timeout=5)
    states = _states(session)
    session.group("g").join("m", b"x")
    own_server.pause()
    try:
        suspended = states.wait_index(lambda state: state is SessionState.SUSPENDED, 10, what="SUSPENDED")
        lost = states.wait_index(lambda state: state is SessionState.LOST, 10, since=suspended, what="LOST")
    finally:
        own_server.resume()
    states.wait_index(lambda state: state is SessionState.CONNECTED, since=lost, what="CONNECTED")
    wait_until(lambda: session.group("g").membership() == {"m": b"x"}, what="the member re-joined")


#: Over the configured timeout, for a bounded call or connect to end on a loaded 2-core machine: the
#: contract's 1 s plus scheduling slack. The latencies themselves: benchmarks/detection.py.
TIMING_SLACK = 3.0


def test_calls_during_an_outage_are_bounded(own_server: ServerHandle, connect: Connect) -> None:
    """With the server down, reads and writes raise OperationTimeoutError within request_timeout
    (plus a margin), and close() returns promptly."""
    request_timeout = 2.0
    session = connect(own_server, session_timeout=10, request_timeout=request_timeout)
    session.storage.put("k", b"v")
    own_server.kill()
    for call in (lambda: session.storage.fetch("k"), lambda: session.storage.update("k", b"w")):
        started = time.monotonic()
        with pytest.raises(OperationTimeoutError):
            call()
        assert time.monotonic() - started < request_timeout + TIMING_SLACK
    started = time.monotonic()
    session.close()
    assert time.monotonic() - started < request_timeout + TIMING_SLACK


def test_unreachable_server_leaves_no_threads() -> None:
    """open() against a closed port fails within connect_timeout and kazoo's threads end."""
    before = set(threading.enumerate())
    started = time.monotonic()
    with pytest.raises(ca.BackendUnavailableError):
        ca.connect(f"zookeeper://{HOST}:{free_port()}/x", connect_timeout=1.5, session_timeout=2)
    assert time.monotonic() - started < 1.5 + TIMING_SLACK
    wait_until(
        lambda: not [t for t in set(threading.enumerate()) - before if t.is_alive()],
        what="kazoo's threads ended",
        observe=lambda: set(threading.enumerate()) - before,
    )


# Configuration, digest authentication and TLS


@pytest.mark.parametrize(
    ("suffix", "options", "message"),
    [
        ("/a/../b", {}, "not a valid ZooKeeper path"),
        ("/x", {"tls_cert": "/nonexistent.pem"}, "no such file"),
        ("/x", {"tls": False, "tls_ca": __file__}, "need tls=true"),
        ("/x", {"tls_key_password": "x"}, "needs 'tls_key'"),
        ("/x", {"tls_cert": __file__}, "given together"),
    ],
)
def test_bad_configuration_is_refused_before_io(suffix: str, options: dict[str, Any], message: str) -> None:
    """A bad chroot or inconsistent TLS options raise ConfigurationError without connecting."""
    with pytest.raises(ConfigurationError, match=message):
        ca.connect(f"zookeeper://{HOST}:{free_port()}{suffix}", **options)
    with pytest.raises(ConfigurationError, match="user and a password"):
        ca.connect(f"zookeeper://alice@{HOST}:{free_port()}/x")


def test_digest_auth_restricts_the_chroot(
    server: ServerHandle, chroot: str, caplog: pytest.LogCaptureFixture
) -> None:
    """user:password creates digest-ACLed znodes; a wrong or missing password is refused clearly,
    and the password never appears in a log record, not even in kazoo's DEBUG output."""
    caplog.set_level(logging.DEBUG)
    secret = f"pw-{uuid.uuid4().hex}"
    hosts = f"{HOST}:{server.port}"
    with ca.connect(f"zookeeper://alice:{secret}@{hosts}{chroot}") as session:
        session.storage.put("k", b"v")
        assert session.storage.fetch("k") is not None
    for url in (f"zookeeper://alice:wrong@{hosts}{chroot}", f"zookeeper://{hosts}{chroot}"):
        with pytest.raises(ConfigurationError, match="refused access") as info:
            ca.connect(url)
        assert secret not in str(info.value) and "wrong" not in str(info.value)
    messages = [record.getMessage() for record in caplog.records]
    assert not [message for message in messages if secret in message]
    assert any("alice:***" in message for message in messages), "kazoo's auth request was not logged"


@pytest.fixture(scope="module")
def secure_server() -> Iterator[ServerHandle]:
    """A ZooKeeper serving TLS only (client certificates required), digest auth, an ACLed chroot."""
    with start_server("zookeeper", secure=True) as handle:
        yield handle


def _secure(handle: ServerHandle, **changes: str) -> tuple[str, dict[str, str]]:
    """The secure server's URL without its query, and its options with ``changes``."""
    base, _, query = handle.url.partition("?")
    return base, {**dict(parse_qsl(query)), **changes}


def test_tls_with_auth_and_client_certificate(secure_server: ServerHandle) -> None:
    """TLS with a client certificate and digest auth; without the certificate the server refuses."""
    url, options = _secure(secure_server)
    with ca.connect(url, **options) as session:
        version = session.storage.put("k", b"over tls")
        assert session.storage.fetch("k") == Versioned(b"over tls", version)
    with pytest.raises(ca.ConsensusError):
        ca.connect(url, tls=True, tls_ca=options["tls_ca"], connect_timeout=2)


@pytest.mark.parametrize(
    ("presented", "cause"),
    [("other-host", "mismatch"), ("expired", "expired"), ("impostor", "unable to get local issuer")],
)
def test_tls_refuses_a_bad_server_certificate_before_sending_anything(
    secure_server: ServerHandle, presented: str, cause: str
) -> None:
    """A certificate for another host name, an expired one, or one from another CA (kazoo would accept
    the first, and any publicly trusted one) ends connect at once; the endpoint receives no byte."""
    url, options = _secure(secure_server)
    certificates = Path(options["tls_ca"]).parent
    with Impostor(certificates, presented) as impostor:
        started = time.monotonic()
        with pytest.raises(ConfigurationError, match=f"TLS certificate was refused: .*{cause}") as refused:
            ca.connect(url.replace(f":{secure_server.port}/", f":{impostor.port}/"), **options)
        assert time.monotonic() - started < 2.0
    assert impostor.received == 0 and impostor.handshakes == 0
    assert url.split(":")[2].split("@")[0] not in str(refused.value)


def test_tls_ca_alone_is_trusted(secure_server: ServerHandle) -> None:
    """With tls_ca naming another CA, the real server is refused (no system CA is added)."""
    url, options = _secure(secure_server)
    other_ca = str(Path(options["tls_ca"]).parent / "other-ca.pem")
    with pytest.raises(ConfigurationError, match="unable to get local issuer"):
        ca.connect(url, **{**options, "tls_ca": other_ca}, connect_timeout=5)
