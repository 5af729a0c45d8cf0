"""The etcd backend against real etcd servers: versions, leases, restarts, watches, fencing.

Faults are real: the server is killed and restarted on its data dir, the
session's lease is revoked by another client, and a TCP proxy between the
backend and etcd cuts every connection (the server itself keeps running).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pyetcd
import pytest

import consensus_api as ca
from consensus_api.backend import Target, TargetKind
from consensus_api.config import build_options, parse_url
from consensus_backends.etcd import EtcdBackend
from consensus_backends.etcd import _storage as etcd_storage
from consensus_backends.etcd._layout import Layout
from consensus_testkit import ServerHandle, start_server
from consensus_testkit.conformance.helpers import EventLog, wait_until
from consensus_testkit.host import HOST
from consensus_testkit.proxy import TcpProxy

LOST, SUSPENDED, CONNECTED = ca.SessionState.LOST, ca.SessionState.SUSPENDED, ca.SessionState.CONNECTED


# Fixtures and fault tools


@pytest.fixture(scope="module")
def server() -> Iterator[ServerHandle]:
    with start_server("etcd") as handle:
        yield handle


@pytest.fixture
def raw(server: ServerHandle) -> Iterator[Any]:
    """A plain pyetcd client, straight to the server."""
    client = pyetcd.MultiEndpointEtcd3Client(
        endpoints=[pyetcd.Endpoint(HOST, server.port, secure=False, time_retry=0.5)], timeout=10
    )
    yield client
    client.close()


@pytest.fixture
def prefix() -> str:
    return f"/t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def sessions() -> Iterator[list[ca.Session]]:
    opened: list[ca.Session] = []
    yield opened
    for session in opened:
        session.close()


@pytest.fixture
def proxy(server: ServerHandle) -> Iterator[TcpProxy]:
    """A TCP proxy in front of the server: ``drop()`` resets every connection until ``heal()``."""
    with TcpProxy(server.port) as forwarder:
        yield forwarder


class Recorder:
    """BackendEvents that records what a bare backend reports."""

    def __init__(self) -> None:
        self.states: EventLog[ca.SessionState] = EventLog("states")
        self.changes: EventLog[Target] = EventLog("changes")

    def state_changed(self, state: ca.SessionState) -> None:
        self.states(state)

    def changed(self, target: Target) -> None:
        self.changes(target)


def open_backend(url: str, events: Recorder, **options: object) -> EtcdBackend:
    parsed, _ = parse_url(url)
    backend = EtcdBackend(parsed, build_options(options, EtcdBackend.options, "etcd"), events)
    backend.open()
    return backend


def member_key(prefix: str, group: str, member: str) -> bytes:
    return Layout.from_path(prefix).member(group, member)


def _has_version(version: int, event: ca.ValueChanged) -> bool:
    return event.version == version


def first(log: EventLog[Any], value: object, since: int = 0) -> int:
    return log.wait_index(lambda item: item == value, since=since, what=repr(value))


# Storage


def test_versions_increase_across_update_delete_and_recreate(server: ServerHandle, prefix: str) -> None:
    with ca.connect(server.url + prefix) as session:
        store = session.storage
        v1 = store.put("a/k", b"1")
        v2 = store.update("a/k", b"2", version=v1)
        store.delete("a/k", version=v2)
        assert store.fetch("a/k") is None
        v3 = store.put("a/k", b"3")
        assert v1 < v2 < v3
        assert store.fetch("a/k") == ca.Versioned(b"3", v3)
        with pytest.raises(ca.VersionConflictError):
            store.update("a/k", b"x", version=v2)
        with pytest.raises(ca.VersionConflictError):
            store.delete("a/k", version=0)
        with pytest.raises(ca.KeyNotFoundError):
            store.update("a/missing", b"x", version=0)
        with pytest.raises(ca.KeyExistsError):
            store.put("a/k", b"again")


def test_keys_pages_skip_deep_subtrees(
    server: ServerHandle, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(etcd_storage, "PAGE_SIZE", 2)
    with ca.connect(server.url + prefix) as session:
        names = ["a", "a-b", "a.c", "b", "c", "d", "z"]
        deep = ["a/x", "a/y/z", "b/1", "b/2", "b/3", "b/4", "b/5", "c0/q", "zz/top"]
        for key in [f"ns/{name}" for name in names + deep] + ["ns", "nsx", "other/ns/q"]:
            session.storage.put(key, b"")
        assert session.storage.keys("ns") == {f"ns/{name}" for name in names}
        assert session.storage.keys("") == {"ns", "nsx"}
        assert session.storage.keys("ns/b") == {f"ns/b/{i}" for i in range(1, 6)}
        assert session.storage.keys("ns/a/y") == {"ns/a/y/z"}


# Fencing and names


def test_stale_and_forged_fences_are_refused(server: ServerHandle, prefix: str) -> None:
    with ca.connect(server.url + prefix) as first_session, ca.connect(server.url + prefix) as second:
        store = first_session.storage
        election = first_session.election("svc")
        assert election.nominate("old")
        old = election.leadership()
        assert old is not None
        assert store.put("k", b"by old", fence=old) > 0
        assert second.election("svc").nominate("next") is False
        nested = second.election("svc/inner")
        assert nested.nominate("elsewhere")  # another service, even though its name starts with svc/
        mine = second.election("svc/inner").leadership()
        assert mine is not None
        # "next" is a candidate whose own key revision would pass a lone key compare:
        # the older "old" still exists, so this forged fence must fail.
        forged = ca.Leadership("svc", "next", mine.term - 1)
        for write in (
            lambda fence: store.put("k2", b"x", fence=fence),
            lambda fence: store.update("k", b"x", fence=fence),
            lambda fence: store.delete("k", fence=fence),
        ):
            with pytest.raises(ca.FencedError):
                write(forged)
            with pytest.raises(ca.FencedError):
                write(ca.Leadership("svc", "old", 0))
        election.resign("old")
        current = second.election("svc").leadership()
        assert current is not None and current.leader_id == "next" and current.term > old.term
        with pytest.raises(ca.FencedError):
            store.update("k", b"stale", fence=old)
        assert store.fetch("k") is not None and store.fetch("k").value == b"by old"  # type: ignore[union-attr]
        with pytest.raises(ca.KeyExistsError):  # the fence holds; the key's own condition fails
            second.storage.put("k", b"x", fence=current)
        assert second.storage.update("k", b"by next", fence=current) > 0
        assert nested.leadership() == mine


def test_groups_whose_names_nest_stay_apart(server: ServerHandle, prefix: str) -> None:
    with ca.connect(server.url + prefix) as session:
        session.group("a").join("m1")
        session.group("a/b").join("m2")
        session.group("a%2Fb").join("m3")
        assert session.group("a").members() == {"m1"}
        assert session.group("a/b").members() == {"m2"}
        assert session.group("a%2Fb").members() == {"m3"}


# Lease loss and session states


def test_revoked_lease_is_lost_then_rejoined(server: ServerHandle, raw: Any, prefix: str) -> None:
    url = server.url + prefix
    with ca.connect(url, session_timeout=6) as session, ca.connect(url, session_timeout=6) as observer:
        states: EventLog[ca.SessionState] = EventLog("states")
        session.add_state_listener(states)
        leaders: EventLog[ca.LeaderChanged] = EventLog("leaders")
        session.group("g").join("m1", b"data")
        assert session.election("svc").nominate("c1")
        session.election("svc").add_listener(leaders)
        before = leaders.wait_for(lambda event: event.leader_id == "c1")
        members: EventLog[ca.MembershipChanged] = EventLog("members")
        observer.group("g").add_listener(members)
        members.wait_for(lambda event: "m1" in event.members)
        _, meta = raw.get(member_key(prefix, "g", "m1"))

        revoked = time.monotonic()
        raw.revoke_lease(meta.lease_id)
        lost_at = first(states, LOST)
        detected = time.monotonic() - revoked
        first(states, CONNECTED, since=lost_at)
        reconnected = time.monotonic() - revoked

        gone = leaders.wait_index(lambda event: event.leader_id is None, what="LeaderChanged(None)")
        assert all(event == before for event in leaders.events[:gone])
        again = leaders.wait_last(lambda event: event.leader_id == "c1", what="c1 leads again")
        assert before.term is not None and again.term is not None and again.term > before.term
        members.wait_last(lambda event: dict(event.members) == {"m1": b"data"})
        _, meta_after = raw.get(member_key(prefix, "g", "m1"))
        assert meta_after.lease_id != meta.lease_id
        assert SUSPENDED not in states.events
        print(f"\nlease revoked: LOST after {detected:.3f}s, CONNECTED after {reconnected:.3f}s")
        # The watch sees the member key deleted and checks the lease at once (benchmarks time it); the
        # bound is the contract's: within the session timeout, however loaded the machine.
        assert detected < 6


def test_revoked_lease_without_keys_is_found_by_the_keepalive(
    server: ServerHandle, raw: Any, prefix: str
) -> None:
    """With no member or candidate to watch, the next keep-alive (every TTL/3) finds the lease gone."""
    events = Recorder()
    backend = open_backend(server.url + prefix, events, session_timeout=3)
    try:
        lease = backend._keeper.held()
        revoked = time.monotonic()
        raw.revoke_lease(lease)
        lost_at = first(events.states, LOST)
        detected = time.monotonic() - revoked
        first(events.states, CONNECTED, since=lost_at)
        assert backend._keeper.held() not in (None, lease)
        print(f"\nlease revoked (no keys): LOST after {detected:.3f}s (TTL 3s, keep-alive every 1s)")
        assert detected < 3  # the next keep-alive (every TTL/3) finds it; the contract's bound: TTL
    finally:
        backend.close()


def test_unreachable_longer_than_ttl_is_lost(server: ServerHandle, proxy: TcpProxy, prefix: str) -> None:
    with (
        ca.connect(f"etcd://{HOST}:{proxy.port}{prefix}", session_timeout=2) as session,
        ca.connect(server.url + prefix, session_timeout=2) as observer,
    ):
        states: EventLog[ca.SessionState] = EventLog("states")
        session.add_state_listener(states)
        session.group("g").join("m")
        members: EventLog[ca.MembershipChanged] = EventLog("members")
        observer.group("g").add_listener(members)
        members.wait_for(lambda event: "m" in event.members)
        cut = time.monotonic()
        proxy.drop()
        suspended_at = first(states, SUSPENDED)
        suspended = time.monotonic() - cut
        members.wait_for(lambda event: "m" not in event.members, what="the member expired")
        first(states, LOST, since=suspended_at)
        lost = time.monotonic() - cut
        proxy.heal()
        first(states, CONNECTED, since=suspended_at)
        members.wait_last(lambda event: "m" in event.members, what="the member re-joined")
        print(f"\nproxy cut: SUSPENDED after {suspended:.3f}s, LOST after {lost:.3f}s (TTL 2s)")
        assert lost >= 2.0


def test_server_restart_suspends_then_reconnects(server: ServerHandle, prefix: str) -> None:
    url = server.url + prefix
    with ca.connect(url, session_timeout=10) as session, ca.connect(url, session_timeout=10) as writer:
        states: EventLog[ca.SessionState] = EventLog("states")
        session.add_state_listener(states)
        session.group("g").join("m")
        values: EventLog[ca.ValueChanged] = EventLog("values")
        session.listeners.add_value_listener("k", values)
        keysets: EventLog[ca.KeySetChanged] = EventLog("keysets")
        session.listeners.add_keyset_listener("", keysets)
        writer.storage.put("k", b"before")
        values.wait_last(lambda event: event.value == b"before")

        killed = time.monotonic()
        server.kill()
        first(states, SUSPENDED)
        suspended = time.monotonic() - killed
        server.restart()
        ready = time.monotonic()
        first(states, CONNECTED)
        recovered = time.monotonic() - ready
        wait_until(lambda: writer.state is CONNECTED, what="the writer reconnected")
        version = writer.storage.update("k", b"after")
        writer.storage.put("k2", b"")
        values.wait_last(lambda event: event.version == version)
        keysets.wait_last(lambda event: event.keys == {"k", "k2"})
        assert LOST not in states.events
        assert session.group("g").members() == {"m"}
        print(f"\nserver kill: SUSPENDED after {suspended:.3f}s; CONNECTED {recovered:.3f}s after it served")


def test_server_pause_shorter_than_the_ttl_only_suspends(server: ServerHandle, prefix: str) -> None:
    with ca.connect(server.url + prefix, session_timeout=10, request_timeout=2) as session:
        states: EventLog[ca.SessionState] = EventLog("states")
        session.add_state_listener(states)
        values: EventLog[ca.ValueChanged] = EventLog("values")
        session.listeners.add_value_listener("k", values)
        session.storage.put("k", b"0")
        server.pause()
        try:
            first(states, SUSPENDED)
            with pytest.raises(ca.OperationTimeoutError):
                session.storage.update("k", b"lost?")
        finally:
            server.resume()
        first(states, CONNECTED)
        version = session.storage.update("k", b"1")
        values.wait_last(lambda event: event.version == version)
        assert LOST not in states.events


def test_sessions_fail_over_to_another_endpoint(server: ServerHandle, proxy: TcpProxy, prefix: str) -> None:
    """Both endpoints reach the one server, one through the proxy; cutting it leaves every session working."""
    url = f"etcd://{HOST}:{proxy.port},{HOST}:{server.port}{prefix}"
    with contextlib.ExitStack() as stack:
        sessions = [stack.enter_context(ca.connect(url, session_timeout=3)) for _ in range(4)]
        logs: list[EventLog[ca.ValueChanged]] = []
        for index, session in enumerate(sessions):
            session.group("g").join(f"m{index}")
            logs.append(EventLog(f"values {index}"))
            session.listeners.add_value_listener("k", logs[-1])
        proxy.drop()
        time.sleep(0.5)  # a write sent just as its connection dies has an unknown effect
        for round_, writer in enumerate(sessions[:3]):
            if round_ == 0:
                written = writer.storage.put("k", b"0")
            else:
                written = writer.storage.update("k", b"%d" % round_)
            for log in logs:
                log.wait_last(functools.partial(_has_version, written))
        wait_until(
            lambda: {session.state for session in sessions} == {CONNECTED},
            5,
            what="all CONNECTED",
            observe=lambda: [session.state for session in sessions],
        )
        assert sessions[0].group("g").members() == {f"m{index}" for index in range(4)}


def test_watch_resumes_after_the_last_seen_revision(
    server: ServerHandle, raw: Any, proxy: TcpProxy, prefix: str
) -> None:
    """A change made while the watch is down arrives once it resumes (a bare backend: no core resync)."""
    events = Recorder()
    backend = open_backend(f"etcd://{HOST}:{proxy.port}{prefix}", events, session_timeout=30)
    try:
        target = Target(TargetKind.VALUE, "k")
        backend.watch(target)
        raw.put(Layout.from_path(prefix).key("k"), b"1")
        events.changes.wait_for(lambda changed: changed == target)
        proxy.drop()
        written = raw.put(Layout.from_path(prefix).key("k"), b"2").header.revision
        mark = len(events.changes)
        proxy.heal()
        events.changes.wait_for(lambda changed: changed == target, since=mark)
        assert backend.fetch("k") == ca.Versioned(b"2", written)
    finally:
        backend.close()


def test_compaction_while_the_watch_is_down_resyncs_everything(
    server: ServerHandle, raw: Any, proxy: TcpProxy, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    events = Recorder()
    backend = open_backend(f"etcd://{HOST}:{proxy.port}{prefix}", events, session_timeout=30)
    layout = Layout.from_path(prefix)
    try:
        changing, quiet = Target(TargetKind.VALUE, "k"), Target(TargetKind.KEYSET, "quiet")
        backend.watch(changing)
        backend.watch(quiet)
        raw.put(layout.key("k"), b"1")
        events.changes.wait_for(lambda changed: changed == changing)
        proxy.drop()
        raw.put(layout.key("k"), b"2")
        response = raw.put(layout.key("k"), b"3")
        raw.compact(response.header.revision, physical=True)
        mark = len(events.changes)
        with caplog.at_level(logging.WARNING, logger="consensus_api.etcd"):
            proxy.heal()
            events.changes.wait_for(lambda changed: changed == quiet, since=mark, what="the resync")
        assert changing in events.changes.events[mark:]
        assert any("compacted" in record.getMessage() for record in caplog.records)
    finally:
        backend.close()


def test_listeners_converge_after_compaction_and_restart(server: ServerHandle, raw: Any, prefix: str) -> None:
    with ca.connect(server.url + prefix, session_timeout=10) as session:
        values: EventLog[ca.ValueChanged] = EventLog("values")
        session.listeners.add_value_listener("k", values)
        session.storage.put("k", b"0")
        values.wait_last(lambda event: event.value == b"0")
        server.kill()
        server.restart()
        response = raw.put(Layout.from_path(prefix).key("k"), b"1")
        raw.compact(response.header.revision, physical=True)
        values.wait_last(lambda event: event.value == b"1")
