"""The ZooKeeper backend's test server: a standalone ZooKeeper (TLS and SASL variant) or an ensemble."""

from __future__ import annotations

from consensus_backends.zookeeper.testkit import ensemble, server
from consensus_testkit.launchers import ClusterLauncher, Launcher

ZOOKEEPER = Launcher(
    name="zookeeper",
    start=server.start,
    probe=server.probe,
    secure=True,
    cluster=ClusterLauncher(
        start=ensemble.start_ensemble, status=server.status, serves_session=server.serves_session
    ),
)
