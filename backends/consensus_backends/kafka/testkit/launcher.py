"""The Kafka backend's test server: a KRaft broker (TLS and SASL variant) or a cluster of KRaft nodes,
whose nodes say which of them coordinates a session's group and leads its command log; run on a Java
17+ runtime from the jars ``kafka-pom.xml`` names, fetched with Maven into the cache dir."""

from __future__ import annotations

from consensus_backends.kafka.testkit import cluster, server
from consensus_testkit.launchers import ClusterLauncher, Launcher
from consensus_testkit.prerequisites import JAVA, MavenJars

KAFKA_JARS = MavenJars(
    what=f"the Kafka {server.kafka_version()} jars",
    pom=server.POM,
    into=f"kafka-{server.kafka_version()}/libs",
)

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
    needs=(JAVA, KAFKA_JARS),
)
