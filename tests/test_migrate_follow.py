"""``consensus migrate --follow``: changes made during and after the copy reach the target (real servers)."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from typing import Any

from kazoo.client import KazooClient
from migrate_support import CLI, WAIT, api_tree, follow_in_thread, raw_tree, stored, wait_equal

import consensus_api as ca
from consensus_api.migrate import Report
from consensus_testkit import ServerHandle


def test_follow_raw_carries_changes_made_during_the_copy(
    zookeeper_server: ServerHandle, kazoo: KazooClient, etcd_target: str
) -> None:
    tree = raw_tree(zookeeper_server, kazoo, 2000)
    root = tree.root
    changed = threading.Event()

    def during_copy(report: Report) -> None:
        if report.phase == "copy" and not changed.is_set():
            changed.set()
            kazoo.set(f"{root}/d1/k0001", b"updated during the copy")
            kazoo.delete(f"{root}/d2/k0002")
            kazoo.create(f"{root}/d3/new", b"created during the copy")
            kazoo.create(f"{root}/brand/new/deep", b"\x00new subtree", makepath=True)
            kazoo.delete(f"{root}/d9", recursive=True)

    _, finish = follow_in_thread(tree.url, etcd_target, raw=True, progress=during_copy, rescan_interval=2)
    deadline = time.monotonic() + WAIT
    while not changed.is_set() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert changed.is_set()
    wait_equal(tree.url, etcd_target, raw=True)
    kazoo.set(f"{root}/d4/k0004", b"updated while following")
    kazoo.delete(f"{root}/d5/k0005")
    kazoo.set(f"{root}/brand", b"an intermediate znode gets data")
    wait_equal(tree.url, etcd_target, raw=True)
    report = finish()
    assert report.ok and not report.conflicts
    final = stored(etcd_target)
    assert final["d1/k0001"] == b"updated during the copy"
    assert final["d4/k0004"] == b"updated while following"
    assert "d2/k0002" not in final and "d5/k0005" not in final
    assert (
        final["brand/new/deep"] == b"\x00new subtree" and final["brand"] == b"an intermediate znode gets data"
    )
    assert not any(key.startswith("d9/") for key in final)


def test_follow_api_source_with_listeners_and_rescan(
    zookeeper_server: ServerHandle, postgresql_target: str
) -> None:
    source, _ = api_tree(zookeeper_server, 100)
    live: list[Report] = []
    with ca.connect(source) as session:
        store = session.storage
        _, finish = follow_in_thread(source, postgresql_target, rescan_interval=1, progress=live.append)
        wait_equal(source, postgresql_target, raw=False)
        store.update("ns1/sub1/k001", b"updated")
        store.delete("ns2/sub2/k002")
        store.put("ns3/sub0/fresh", b"new key in a known namespace")
        store.put("never/seen/before", b"new namespace: found by the rescan")
        store.delete("top")
        store.put("top", b"re-created")
        wait_equal(source, postgresql_target, raw=False)
        with ca.connect(postgresql_target) as client:  # a switched client writes the target: its value wins
            client.storage.update("ns4/sub1/k004", b"written on the new backend")
        store.update("ns4/sub1/k004", b"late write on the old backend")
        store.update("ns0", b"still copied")
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline and not (
            stored(postgresql_target).get("ns0") == b"still copied" and "ns4/sub1/k004" in live[-1].conflicts
        ):
            time.sleep(0.2)
        report = finish()
    final = stored(postgresql_target)
    assert final["ns0"] == b"still copied" and final["top"] == b"re-created"
    assert final["ns4/sub1/k004"] == b"written on the new backend"
    assert report.conflicts == ["ns4/sub1/k004"]


def test_cli_follow_stops_on_sigterm_in_sync(tmp_path: Any) -> None:
    source, target = f"sqlite:///{tmp_path / 'old.db'}", f"sqlite:///{tmp_path / 'new.db'}"
    expected = {"app/a": b"2", "app/b": b"new in a known namespace", "brand/new/key": b"found by the rescan"}
    with ca.connect(source) as session:
        session.storage.put("app/a", b"1")
        command = [*CLI, "migrate", "--from", source, "--to", target, "--follow", "--rescan-interval", "0.5"]
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            deadline = time.monotonic() + WAIT
            while "app/a" not in stored(target) and time.monotonic() < deadline:
                time.sleep(0.2)
            session.storage.update("app/a", b"2")
            session.storage.put("app/b", b"new in a known namespace")
            session.storage.put("brand/new/key", b"found by the rescan")
            while stored(target) != expected and time.monotonic() < deadline:
                time.sleep(0.2)
            process.send_signal(signal.SIGTERM)
            out, err = process.communicate(timeout=WAIT)
        finally:
            process.kill()
    assert process.returncode == 0, err.decode()
    assert b"stopped following, in sync" in err and b"copied: 1 create" in out
    assert stored(target) == {
        "app/a": b"2",
        "app/b": b"new in a known namespace",
        "brand/new/key": b"found by the rescan",
    }
