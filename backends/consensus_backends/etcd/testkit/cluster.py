"""An etcd cluster on loopback: ``nodes`` members of etcd ``ETCD_VERSION``, each on free ports.

Member ids are hashed from the peer URLs of ``--initial-cluster``, so every
member must name member ``m`` by the same URL: ``m`` advertises a port where a
``consensus_testkit.peer_router.PeerRouter`` listens and hands each
connection to the proxy of its directed link (``"k>m:peer"``,
``consensus_testkit.links``), which forwards it to the peer port ``m``
really listens on. Stalling the links of a node (``isolate``) cuts it off the
others while it keeps running and serving clients (which then get
``no leader`` or time out: reads are linearizable).

Timing: ``--heartbeat-interval=HEARTBEAT_MS --election-timeout=ELECTION_MS``,
chosen so that a loaded 2-core machine calls no needless election, while a
lost leader is replaced in about a second. ``--unsafe-no-fsync`` like the
single member.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from consensus_backends.etcd.testkit.server import binary, probe, serves_session, status
from consensus_testkit.cluster import ClusterHandle, link_name
from consensus_testkit.host import HOST, free_port
from consensus_testkit.links import Links
from consensus_testkit.process import ServerHandle

START_TIMEOUT = 60.0
HEARTBEAT_MS, ELECTION_MS = 100, 1000


def start_cluster(workdir: Path | None, nodes: int) -> ClusterHandle:
    """Start ``nodes`` etcd members as one cluster and wait until it serves; RuntimeError with the
    logs' tails otherwise (nothing is left running then)."""
    binary()  # a missing binary fails before anything is created
    directory = Path(tempfile.mkdtemp(prefix="etcd-cluster-", dir=workdir))
    ids = range(1, nodes + 1)
    client = {n: free_port() for n in ids}
    own = {n: free_port() for n in ids}  # the peer port each member listens on
    advertised = {n: free_port() for n in ids}  # its router's port, in every member's view
    links: dict[str, tuple[int, int]] = {}
    routers: dict[int, dict[int, int]] = {advertised[n]: {} for n in ids}
    for source in ids:
        for target in ids:
            if source != target:
                port = free_port()
                links[link_name(source, target, "peer")] = (port, own[target])
                routers[advertised[target]][own[source]] = port
    link_process = Links.start(directory / "links", links, routers)
    initial = ",".join(f"n{n}=http://{HOST}:{advertised[n]}" for n in ids)
    handles = [_member(n, directory / f"node{n}", client[n], (own[n], advertised[n]), initial) for n in ids]
    url = "etcd://" + ",".join(f"{HOST}:{client[n]}" for n in ids)
    return ClusterHandle(
        "etcd", url, handles, directory, link_process, status=status, serves_session=serves_session
    ).start(START_TIMEOUT)


def _member(node: int, directory: Path, client: int, peer: tuple[int, int], initial: str) -> ServerHandle:
    """The (not yet started) member ``node``: clients on ``client``, peers on ``peer``: (the port it
    listens on, the port it is reached at)."""
    own, advertised = peer
    directory.mkdir(parents=True)
    client_url = f"http://{HOST}:{client}"
    command = [
        binary(),
        "--name",
        f"n{node}",
        "--data-dir",
        str(directory / "data"),
        "--listen-client-urls",
        client_url,
        "--advertise-client-urls",
        client_url,
        "--listen-peer-urls",
        f"http://{HOST}:{own}",
        "--initial-advertise-peer-urls",
        f"http://{HOST}:{advertised}",
        "--initial-cluster",
        initial,
        "--initial-cluster-state",
        "new",
        "--initial-cluster-token",
        "consensus-test",
        "--heartbeat-interval",
        str(HEARTBEAT_MS),
        "--election-timeout",
        str(ELECTION_MS),
        "--unsafe-no-fsync",
    ]
    return ServerHandle(
        "etcd", f"etcd://{HOST}:{client}", client, directory, command=command, probe=lambda: probe(client)
    )
