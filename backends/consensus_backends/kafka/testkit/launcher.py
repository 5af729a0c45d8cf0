"""The Kafka backend's test server: a KRaft broker (TLS and SASL variant) or a cluster of KRaft nodes,
whose nodes say which of them coordinates a session's group and leads its command log."""

from __future__ import annotations

from consensus_backends.kafka.testkit import cluster, server
from consensus_testkit.launchers import ClusterLauncher, Launcher

KAFKA = Launcher(
    name="kafka",
    start=server.start,
    probe=server.probe,
    secure=True,
    cluster=ClusterLauncher(
        start=cluster.start_cluster,
        status=cluster.status,
        serves_session=cluster.serves_session,
        holders=cluster.holders,
    ),
)
