"""Helpers of the migration tests: raw and API-written ZooKeeper trees, targets, bounded waits."""

from __future__ import annotations

import hashlib
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kazoo.client import KazooClient

import consensus_api as ca
from consensus_api.migrate import LEDGER, Report, migrate
from consensus_testkit import ServerHandle

WAIT = 60.0
CLI = [sys.executable, "-m", "consensus_api.cli"]


@dataclass
class Tree:
    """A raw ZooKeeper tree: its URL and the keys a migration must produce."""

    url: str
    root: str
    expected: dict[str, bytes]
    unholdable: set[str]


def raw_tree(zookeeper: ServerHandle, kazoo: KazooClient, keys: int) -> Tree:
    """A smaller raw tree: ``keys`` binary leaves in 10 directories."""
    root = f"/small-{uuid.uuid4().hex[:8]}"
    expected = {f"d{i % 10}/k{i:04d}": value_of(i) for i in range(keys)}
    for d in range(10):
        kazoo.ensure_path(f"{root}/d{d}")
    settle([kazoo.create_async(f"{root}/{name}", data) for name, data in expected.items()])
    return Tree(f"zookeeper://{hosts(zookeeper)}{root}", root, expected, set())


def api_tree(zookeeper: ServerHandle, keys: int) -> tuple[str, dict[str, bytes]]:
    """Keys written through the API on ZooKeeper: nested, binary, a key with keys below it."""
    url = f"{zookeeper.url}/app-{uuid.uuid4().hex[:8]}"
    expected = {f"ns{i % 5}/sub{i % 3}/k{i:03d}": value_of(i) for i in range(keys)}
    expected |= {"ns0": b"parent", "top": b"", "bin/\u00e9": bytes(range(256))}
    with ca.connect(url) as session:
        for key, value in expected.items():
            session.storage.put(key, value)
    return url, expected


def hosts(server: ServerHandle) -> str:
    return server.url.split("://", 1)[1].split("/", 1)[0]


def value_of(index: int) -> bytes:
    """Binary values of 0-39 bytes (some empty), NULs and 0xFF included."""
    return hashlib.sha256(b"%d" % index).digest()[: index % 40] + (b"\x00\xff" if index % 3 else b"")


def settle(requests: list[Any]) -> None:
    for request in requests:
        request.get(timeout=WAIT)


def stored(url: str, prefix: str = "") -> dict[str, bytes]:
    """Every key of ``url`` (below ``prefix``), without the migration's ledger."""
    with ca.connect(url) as session:
        return {key: found.value for key, found in session.storage.walk(prefix) if not key.startswith(LEDGER)}


def wait_equal(source: str, target: str, *, raw: bool) -> Report:
    """Poll ``verify`` until it finds no difference; fail after ``WAIT`` seconds."""
    deadline = time.monotonic() + WAIT
    while True:
        report = migrate(source, target, raw=raw, verify=True)
        if not report.differences or time.monotonic() > deadline:
            assert report.differences == []
            return report
        time.sleep(0.5)


def follow_in_thread(source: str, target: str, **kwargs: Any) -> tuple[threading.Event, Callable[[], Report]]:
    """Start ``migrate(follow=True)``; returns the stop event and a function that stops and joins it."""
    stop, results = threading.Event(), []
    thread = threading.Thread(
        target=lambda: results.append(migrate(source, target, follow=True, stop=stop, **kwargs)), daemon=True
    )
    thread.start()

    def finish() -> Report:
        stop.set()
        thread.join(WAIT)
        assert not thread.is_alive() and results, "the follower did not stop"
        return results[0]

    return stop, finish
