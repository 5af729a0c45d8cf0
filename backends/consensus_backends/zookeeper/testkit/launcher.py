"""The ZooKeeper backend's test server: a standalone ZooKeeper (TLS and SASL variant) or an ensemble,
from Debian's ``zookeeper`` jars on a Java 17+ runtime."""

from __future__ import annotations

from consensus_backends.zookeeper.testkit import ensemble, server
from consensus_testkit.launchers import ClusterLauncher, Launcher
from consensus_testkit.prerequisites import JAVA, DebianPackage

ZOOKEEPER_PACKAGE = DebianPackage(
    what="ZooKeeper", packages=("zookeeper",), present=(server.JAVA_DIR / "zookeeper.jar").is_file
)

ZOOKEEPER = Launcher(
    name="zookeeper",
    start=server.start,
    probe=server.probe,
    secure=True,
    cluster=ClusterLauncher(
        start=ensemble.start_ensemble, status=server.status, serves_session=server.serves_session
    ),
    needs=(JAVA, ZOOKEEPER_PACKAGE),
)
