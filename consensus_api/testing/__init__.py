"""Real servers on free loopback ports for tests: PostgreSQL, ZooKeeper, etcd and Kafka.

``start_server(name)`` returns a ready :class:`ServerHandle`; every server has
its own temp dir (inside ``workdir`` when given) and is controlled by PID.
``ServerHandle.attach(path)`` rebuilds a handle in another process from the
control file ``consensus servers run`` writes (``$CONSENSUS_CONTROL``).
``consensus_api.testing.proxy`` puts a TCP proxy between clients and a server,
``consensus_api.testing.faults`` ends a client's session on the server side.
Run ``scripts/install.sh`` first on a new machine.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from consensus_api.testing import etcd, kafka, postgresql, zookeeper
from consensus_api.testing._process import ServerHandle
from consensus_api.testing.zookeeper import expire_zookeeper_session

__all__ = ["SERVER_NAMES", "ServerHandle", "expire_zookeeper_session", "probe_for", "start_server"]

SERVER_NAMES = ("postgresql", "zookeeper", "etcd", "kafka")

_STARTERS: dict[str, Callable[[Path | None], ServerHandle]] = {
    "postgresql": postgresql.start,
    "zookeeper": zookeeper.start,
    "etcd": etcd.start,
    "kafka": kafka.start,
}

_PROBES: dict[str, Callable[[int], bool]] = {
    "postgresql": postgresql.probe,
    "zookeeper": zookeeper.probe,
    "etcd": etcd.probe,
    "kafka": kafka.probe,
}


def start_server(name: str, workdir: Path | None = None) -> ServerHandle:
    """Start the named server and wait until it is ready.

    Raises ValueError for an unknown name and RuntimeError, with the tail of
    the server's log, when it cannot start; nothing is left running then.
    """
    try:
        starter = _STARTERS[name]
    except KeyError:
        raise ValueError(f"unknown server {name!r}; expected one of {SERVER_NAMES}") from None
    return starter(workdir)


def probe_for(name: str, port: int) -> Callable[[], bool]:
    """The readiness probe of the server ``name`` listening on ``port``; ValueError for unknown names."""
    try:
        probe = _PROBES[name]
    except KeyError:
        raise ValueError(f"unknown server {name!r}; expected one of {SERVER_NAMES}") from None
    return lambda: probe(port)
