"""OpenStack tooz as a baseline: its URL for one of our servers, coordinators, and the watcher pump.

tooz runs watchers only inside ``run_watchers()``; as an application must,
:class:`Pump` calls it every ``PUMP_INTERVAL`` (10 ms) on a thread of its
own. What tooz can do per backend (docs/performance.md, notes/anchors.md):
membership on ZooKeeper (``zookeeper://``), etcd (``etcd3+http://``, via
etcd3gw) and Redis (tooz's ``redis://`` driver); election only on ZooKeeper
(a kazoo ``Lock``); nothing of either on PostgreSQL (its driver is
lock-only), SQLite or Kafka.
"""

from __future__ import annotations

import contextlib
import logging
import threading

from tooz import coordination
from tooz.coordination import CoordinationDriver

from consensus_api import config

log = logging.getLogger("benchmarks")

PUMP_INTERVAL = 0.010

#: Why tooz is no baseline, per backend and feature.
MISSING = {
    ("membership", "postgresql"): "tooz has no membership on PostgreSQL (its driver is lock-only)",
    ("membership", "sqlite"): "tooz has no SQLite driver",
    ("membership", "kafka"): "tooz has no Kafka driver",
    ("election", "etcd"): "tooz cannot elect a leader on etcd (etcd3gw: not implemented)",
    ("election", "postgresql"): "tooz cannot elect a leader on PostgreSQL (its driver is lock-only)",
    ("election", "sqlite"): "tooz has no SQLite driver",
    ("election", "kafka"): "tooz has no Kafka driver",
    ("election", "redis"): "tooz's Redis driver has no get_leader or stand-down, so no failover to time",
}


def tooz_url(url: str, feature: str, timeout: float = 10.0) -> str | None:
    """tooz's URL for the server ``url`` names, or None where tooz lacks ``feature`` there."""
    parsed, _ = config.parse_url(url)
    scheme = "zookeeper" if parsed.scheme == "zk" else parsed.scheme
    if (feature, scheme) in MISSING or scheme.startswith("postgresql"):
        return None
    first = parsed.endpoints[0]
    seconds = max(1, round(timeout))
    if scheme == "zookeeper":
        return f"zookeeper://{first.host}:{first.port or 2181}?timeout={seconds}"
    if scheme == "redis":  # tooz's own Redis driver: member hash and beat keys with a TTL
        return f"redis://{first.host}:{first.port or 6379}?timeout={seconds}&membership_timeout={seconds}"
    return f"etcd3+http://{first.host}:{first.port or 2379}?timeout={seconds}&membership_timeout={seconds}"


def missing(url: str, feature: str) -> str:
    """Why tooz is no baseline for ``feature`` on the backend of ``url``."""
    parsed, _ = config.parse_url(url)
    scheme = "postgresql" if parsed.scheme.startswith("postgresql") else parsed.scheme
    return MISSING.get((feature, scheme), "tooz has no driver for this backend")


def coordinator(url: str, member: str) -> CoordinationDriver:
    """A started tooz coordinator (heartbeat thread on) for ``member``."""
    coord = coordination.get_coordinator(url, member.encode())
    coord.start(start_heart=True)
    return coord


def create_group(coord: CoordinationDriver, group: str) -> None:
    """Create ``group``; an existing group is fine."""
    with contextlib.suppress(coordination.GroupAlreadyExist):
        coord.create_group(group.encode()).get()


class Pump:
    """Calls ``run_watchers()`` of a tooz coordinator every ``PUMP_INTERVAL`` until stopped."""

    def __init__(self, coord: CoordinationDriver) -> None:
        self._coord = coord
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tooz-pump", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(PUMP_INTERVAL):
            try:
                self._coord.run_watchers()
            except Exception as exc:  # tooz raises its own errors; keep pumping as an application would
                log.debug("tooz run_watchers failed: %s", exc)

    def stop(self) -> None:
        """Stop pumping (waits for the current call, bounded)."""
        self._stop.set()
        self._thread.join(5)


def stop(coord: CoordinationDriver) -> None:
    """Stop a tooz coordinator, ignoring errors (its session may already be gone)."""
    try:
        coord.stop()
    except Exception as exc:
        log.debug("stopping a tooz coordinator failed: %s", exc)
