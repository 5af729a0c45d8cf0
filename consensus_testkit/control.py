"""Handles rebuilt from control files: a server or cluster that ``consensus servers run`` started,
controlled from another process (the conformance suite, a chaos run) by PID.

``attach(path)`` reads the control file ``$CONSENSUS_CONTROL`` names and gives
a ``ServerHandle`` or, for a cluster's file, a ``ClusterHandle``; the server's
launcher (``consensus_testkit.launchers``) supplies its readiness probe and
what each cluster node says of itself.
"""

from __future__ import annotations

from pathlib import Path

from consensus_testkit.cluster import ClusterHandle, is_cluster_control
from consensus_testkit.launchers import launcher, probe_for
from consensus_testkit.process import ServerHandle


def attach_server(path: Path) -> ServerHandle:
    """The single server the control file ``path`` describes; ValueError when it is unreadable."""
    return ServerHandle.attach(path, probe_for)


def attach_cluster(path: Path) -> ClusterHandle:
    """The cluster the control file ``path`` describes; ValueError when it is unreadable or describes
    no cluster."""
    return ClusterHandle.attach(path, attach_server, launcher)


def attach(path: Path) -> ServerHandle | ClusterHandle:
    """The server or cluster the control file ``path`` describes; ValueError when it is unreadable."""
    return attach_cluster(path) if is_cluster_control(path) else attach_server(path)
