"""The etcd backend against a real etcd server: versions, key pages, fencing, names, and watches
that resume after a cut connection, a compaction or a restart.

Faults are real: the server is restarted on its data dir, and a TCP proxy
between the backend and etcd cuts every connection (the server itself keeps
running). Leases and session states: tests/test_etcd_sessions.py.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from etcd_support import Recorder, open_backend

import consensus_api as ca
from consensus_api.backend import Target, TargetKind
from consensus_backends.etcd import storage as etcd_storage
from consensus_backends.etcd.layout import Layout
from consensus_testkit import ServerHandle
from consensus_testkit.conformance.helpers import EventLog
from consensus_testkit.host import HOST
from consensus_testkit.proxy import TcpProxy

# Storage


def test_versions_increase_across_update_delete_and_recreate(
    etcd_module_server: ServerHandle, etcd_prefix: str
) -> None:
    with ca.connect(etcd_module_server.url + etcd_prefix) as session:
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
    etcd_module_server: ServerHandle, etcd_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(etcd_storage, "PAGE_SIZE", 2)
    with ca.connect(etcd_module_server.url + etcd_prefix) as session:
        names = ["a", "a-b", "a.c", "b", "c", "d", "z"]
        deep = ["a/x", "a/y/z", "b/1", "b/2", "b/3", "b/4", "b/5", "c0/q", "zz/top"]
        for key in [f"ns/{name}" for name in names + deep] + ["ns", "nsx", "other/ns/q"]:
            session.storage.put(key, b"")
        assert session.storage.keys("ns") == {f"ns/{name}" for name in names}
        assert session.storage.keys("") == {"ns", "nsx"}
        assert session.storage.keys("ns/b") == {f"ns/b/{i}" for i in range(1, 6)}
        assert session.storage.keys("ns/a/y") == {"ns/a/y/z"}


# Fencing and names


def test_stale_and_forged_fences_are_refused(etcd_module_server: ServerHandle, etcd_prefix: str) -> None:
    with (
        ca.connect(etcd_module_server.url + etcd_prefix) as first_session,
        ca.connect(etcd_module_server.url + etcd_prefix) as second,
    ):
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


def test_groups_whose_names_nest_stay_apart(etcd_module_server: ServerHandle, etcd_prefix: str) -> None:
    with ca.connect(etcd_module_server.url + etcd_prefix) as session:
        session.group("a").join("m1")
        session.group("a/b").join("m2")
        session.group("a%2Fb").join("m3")
        assert session.group("a").members() == {"m1"}
        assert session.group("a/b").members() == {"m2"}
        assert session.group("a%2Fb").members() == {"m3"}


def test_watch_resumes_after_the_last_seen_revision(
    etcd_module_server: ServerHandle, etcd_raw: Any, etcd_proxy: TcpProxy, etcd_prefix: str
) -> None:
    """A change made while the watch is down arrives once it resumes (a bare backend: no core resync)."""
    events = Recorder()
    backend = open_backend(f"etcd://{HOST}:{etcd_proxy.port}{etcd_prefix}", events, session_timeout=30)
    try:
        target = Target(TargetKind.VALUE, "k")
        backend.watch(target)
        etcd_raw.put(Layout.from_path(etcd_prefix).key("k"), b"1")
        events.changes.wait_for(lambda changed: changed == target)
        etcd_proxy.drop()
        written = etcd_raw.put(Layout.from_path(etcd_prefix).key("k"), b"2").header.revision
        mark = len(events.changes)
        etcd_proxy.heal()
        events.changes.wait_for(lambda changed: changed == target, since=mark)
        assert backend.fetch("k") == ca.Versioned(b"2", written)
    finally:
        backend.close()


def test_compaction_while_the_watch_is_down_resyncs_everything(
    etcd_module_server: ServerHandle,
    etcd_raw: Any,
    etcd_proxy: TcpProxy,
    etcd_prefix: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    events = Recorder()
    backend = open_backend(f"etcd://{HOST}:{etcd_proxy.port}{etcd_prefix}", events, session_timeout=30)
    layout = Layout.from_path(etcd_prefix)
    try:
        changing, quiet = Target(TargetKind.VALUE, "k"), Target(TargetKind.KEYSET, "quiet")
        backend.watch(changing)
        backend.watch(quiet)
        etcd_raw.put(layout.key("k"), b"1")
        events.changes.wait_for(lambda changed: changed == changing)
        etcd_proxy.drop()
        etcd_raw.put(layout.key("k"), b"2")
        response = etcd_raw.put(layout.key("k"), b"3")
        etcd_raw.compact(response.header.revision, physical=True)
        mark = len(events.changes)
        with caplog.at_level(logging.WARNING, logger="consensus_api.etcd"):
            etcd_proxy.heal()
            events.changes.wait_for(lambda changed: changed == quiet, since=mark, what="the resync")
        assert changing in events.changes.events[mark:]
        assert any("compacted" in record.getMessage() for record in caplog.records)
    finally:
        backend.close()


def test_listeners_converge_after_compaction_and_restart(
    etcd_module_server: ServerHandle, etcd_raw: Any, etcd_prefix: str
) -> None:
    with ca.connect(etcd_module_server.url + etcd_prefix, session_timeout=10) as session:
        values: EventLog[ca.ValueChanged] = EventLog("values")
        session.listeners.add_value_listener("k", values)
        session.storage.put("k", b"0")
        values.wait_last(lambda event: event.value == b"0")
        etcd_module_server.kill()
        etcd_module_server.restart()
        response = etcd_raw.put(Layout.from_path(etcd_prefix).key("k"), b"1")
        etcd_raw.compact(response.header.revision, physical=True)
        values.wait_last(lambda event: event.value == b"1")
