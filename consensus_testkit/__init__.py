"""The consensus-api test kit: real servers for tests, fault tools, and the conformance suite.

Installed with ``pip install 'consensus-api[conformance]'``; the runtime
(``consensus_api``) never imports it.

- ``start_server(name)`` returns a ready :class:`ServerHandle` on free loopback
  ports, in its own temp dir (inside ``workdir`` when given), controlled by PID;
  ``start_cluster(name, nodes)`` a :class:`ClusterHandle`;
  ``start_store(name)`` also knows ``sqlite``: a fresh database file.
- ``consensus_testkit.launchers``: the :class:`Launcher` each backend's
  test-side module registers (entry-point group ``consensus_testkit.launchers``).
- ``consensus_testkit.profile``: the :class:`TestProfile` each backend
  registers (entry-point group ``consensus_testkit.profiles``).
- ``consensus_testkit.control.attach(path)`` rebuilds a handle in another
  process from the control file ``consensus servers run`` writes
  (``$CONSENSUS_CONTROL``).
- ``consensus_testkit.proxy`` puts a TCP proxy between clients and a server,
  ``consensus_testkit.faults`` ends a client's session on the server side,
  ``consensus_testkit.netns`` cuts clients off in network namespaces.
- ``consensus_testkit.conformance``: the contract as an opt-in pytest plugin.
"""

from __future__ import annotations

from pathlib import Path

from consensus_testkit.cluster import ClusterHandle
from consensus_testkit.launchers import (
    ClusterLauncher,
    Launcher,
    cluster_names,
    launcher,
    require_launchers,
    secure_names,
    server_names,
    start_cluster,
    start_server,
    store_names,
)
from consensus_testkit.process import ServerHandle
from consensus_testkit.sqlite import DatabaseFile

__all__ = [
    "ClusterHandle",
    "ClusterLauncher",
    "DatabaseFile",
    "Launcher",
    "ServerHandle",
    "cluster_names",
    "launcher",
    "require_launchers",
    "secure_names",
    "server_names",
    "start_cluster",
    "start_server",
    "start_store",
    "store_names",
]


def start_store(
    name: str, workdir: Path | None = None, *, secure: bool = False
) -> ServerHandle | DatabaseFile:
    """``start_server(name)``, or for ``sqlite`` a fresh ``DatabaseFile``."""
    if name == "sqlite" and not secure:
        return DatabaseFile(workdir)
    return start_server(name, workdir, secure=secure)
