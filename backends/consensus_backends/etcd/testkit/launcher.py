"""The etcd backend's test server: a single etcd (TLS and auth variant) or a cluster of members, run
from etcd and etcdctl built with Go into the cache dir (or ``$CONSENSUS_ETCD_BINARY``)."""

from __future__ import annotations

from consensus_backends.etcd.testkit import cluster, server
from consensus_testkit.launchers import ClusterLauncher, Launcher
from consensus_testkit.prerequisites import GoBuild

ETCD_BINARIES = GoBuild(
    what=f"etcd {server.ETCD_VERSION}",
    into=f"etcd-{server.ETCD_VERSION}",
    version=server.ETCD_VERSION,
    # `go install go.etcd.io/etcd/server/v3@v…` is refused (replace directives in its go.mod): both are
    # built as dependencies of a throwaway module
    binaries=(("etcd", "go.etcd.io/etcd/server/v3"), ("etcdctl", "go.etcd.io/etcd/etcdctl/v3")),
    instead=server.BINARY_VARIABLE,
)

ETCD = Launcher(
    name="etcd",
    start=server.start,
    probe=server.probe,
    secure=True,
    cluster=ClusterLauncher(
        start=cluster.start_cluster, status=server.status, serves_session=server.serves_session
    ),
    needs=(ETCD_BINARIES,),
)
