"""A ZooKeeper ensemble on loopback: ``nodes`` servers (``QuorumPeerMain``) from Debian's jars.

Every server has its own dir (``myid``, data, log), a free client port and
free quorum and election ports. Its ``server.N`` lines name itself at its own
ports and every peer at the port of a proxy for that directed link
(``consensus_testkit.links``: ``"1>2:quorum"`` is server 1's connection to
server 2's quorum port), so a link can be stalled while both ends run. A
follower always opens its quorum connection to the leader itself, so a stalled
quorum link cuts the data path of that pair for certain; an election
connection ZooKeeper opens back to a peer of lower id goes to the address that
peer announces, around the proxy, which lets an isolated server take part in
elections but never follow or lead.

Timing: ``tickTime=500``; a follower that hears nothing from its leader for
``syncLimit`` ticks (1 s) drops its clients and looks for a leader;
``initLimit`` 10 ticks to sync. Each JVM runs with a 128 MiB heap and SerialGC.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from consensus_backends.zookeeper.testkit.server import (
    _classpath,
    _command,
    _write_config,
    probe,
    serves_session,
    status,
)
from consensus_testkit.cluster import ClusterHandle, link_name
from consensus_testkit.host import HOST, free_port, java_binary
from consensus_testkit.links import Links
from consensus_testkit.process import ServerHandle

QUORUM_MAIN = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
#: Per node; ZooKeeper needs little heap for tests.
HEAP = "128m"
START_TIMEOUT = 60.0
#: In ticks of 500 ms: to connect and sync to a leader; without a leader's word before a follower looks.
INIT_LIMIT, SYNC_LIMIT = 10, 2
#: Election connections give up after this many milliseconds (ZooKeeper's default: 5000).
CONNECT_TIMEOUT_MS = 1000


def start_ensemble(workdir: Path | None, nodes: int) -> ClusterHandle:
    """Start ``nodes`` ZooKeeper servers as one ensemble and wait until it serves; RuntimeError with
    the logs' tails otherwise (nothing is left running then)."""
    java_binary()  # RuntimeError naming what to install before anything starts
    _classpath()
    directory = Path(tempfile.mkdtemp(prefix="zookeeper-ensemble-", dir=workdir))
    ids = range(1, nodes + 1)
    client = {n: free_port() for n in ids}
    own = {n: (free_port(), free_port()) for n in ids}  # quorum, election
    links: dict[str, tuple[int, int]] = {}
    view: dict[tuple[int, int], tuple[int, int]] = {}  # (from, to) -> the proxy ports of that link
    for source in ids:
        for target in ids:
            if source != target:
                quorum, election = free_port(), free_port()
                links[link_name(source, target, "quorum")] = (quorum, own[target][0])
                links[link_name(source, target, "election")] = (election, own[target][1])
                view[source, target] = (quorum, election)
    link_process = Links.start(directory / "links", links)
    try:
        handles = [_node(n, directory / f"node{n}", client[n], _peers(n, own, view)) for n in ids]
    except BaseException:
        link_process.stop()
        shutil.rmtree(directory, ignore_errors=True)
        raise
    url = "zookeeper://" + ",".join(f"{HOST}:{client[n]}" for n in ids)
    return ClusterHandle(
        "zookeeper", url, handles, directory, link_process, status=status, serves_session=serves_session
    ).start(START_TIMEOUT)


def _peers(node: int, own: dict[int, tuple[int, int]], view: dict[tuple[int, int], tuple[int, int]]) -> str:
    """The ``server.N`` lines of ``node``: itself at its own ports, every peer at its link's proxy."""
    return "".join(
        f"server.{m}={HOST}:{own[m][0]}:{own[m][1]}\n"
        if m == node
        else f"server.{m}={HOST}:{view[node, m][0]}:{view[node, m][1]}\n"
        for m in own
    )


def _node(node: int, directory: Path, port: int, peers: str) -> ServerHandle:
    """The (not yet started) server ``node`` of the ensemble, clients on ``port``."""
    (directory / "data").mkdir(parents=True)
    (directory / "data" / "myid").write_text(f"{node}\n")
    config = _write_config(directory, port, f"initLimit={INIT_LIMIT}\nsyncLimit={SYNC_LIMIT}\n{peers}")
    command = _command(java_binary(), _classpath(), directory, config, QUORUM_MAIN, heap=HEAP)
    command.insert(1, f"-Dzookeeper.cnxTimeout={CONNECT_TIMEOUT_MS}")
    return ServerHandle(
        "zookeeper", f"zookeeper://{HOST}:{port}", port, directory, command=command, probe=lambda: probe(port)
    )
