"""The etcd backend's test server: a single etcd (TLS and auth variant) or a cluster of members."""

from __future__ import annotations

from consensus_backends.etcd.testkit import cluster, server
from consensus_testkit.launchers import ClusterLauncher, Launcher

ETCD = Launcher(
    name="etcd",
    start=server.start,
    probe=server.probe,
    secure=True,
    cluster=ClusterLauncher(
        start=cluster.start_cluster, status=server.status, serves_session=server.serves_session
    ),
)
