"""A Kafka cluster on loopback: ``nodes`` combined KRaft nodes (broker + controller) from the jars
of ``consensus_backends.kafka.testkit.server``, a static ``controller.quorum.voters`` quorum.

Clients reach every node at its own ``PLAINTEXT`` port (advertised as is), so
a node stays reachable while it is isolated from its peers. Node-to-node
traffic crosses one proxy per directed link (``consensus_testkit.links``):
a node names each peer's controller at the proxy of its link
(``"1>2:controller"``) in its ``controller.quorum.voters``, and fetches
replicas over a listener of its own (node ``n``'s inter-broker listener is
``FROMn``, which every node serves and advertises at the proxy of the link
``"n>m:broker"``), so ``isolate(n)`` stalls the Raft and the replication
traffic of node ``n`` only. Like the single node, every node also has a
``PROXIED`` listener advertised at a port where nothing listens until a test
puts a proxy there (``ServerHandle.proxy_port``): a client that bootstraps
through node 1's proxy is told of every broker at its proxy
(``ClusterHandle.fronts``), so one ``ProxyGroup`` cuts it off the whole cluster.

Replication: every topic defaults to replication factor 3 and
``min.insync.replicas=2``, ``__consumer_offsets`` too; a follower that
fetches nothing for ``REPLICA_LAG_MS`` leaves the ISR, a broker silent for
2 s is fenced; no automatic preferred-leader election moves a partition
back once its preferred replica returns. Each JVM runs with a 384 MiB heap and SerialGC.

``status`` reports a node's KRaft role (``leader``: the active controller) and
the epoch of its quorum state (its own ``quorum-state`` file, read when the
node answers a request); ``holders`` names the nodes that hold a session's
group coordinators and its command-log partition leader.
"""

from __future__ import annotations

import json
import shutil
import socket
import struct
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kafka.errors import KafkaError

from consensus_backends.kafka.testkit.server import (
    LOG4J2,
    TOOL_JVM,
    _cluster_id,
    _server_properties,
    admin_client,
    libs_dir,
    probe,
)
from consensus_testkit.cluster import FOLLOWER, LEADER, ClusterHandle, NodeStatus, link_name
from consensus_testkit.host import HOST, free_port, java_binary, run_checked
from consensus_testkit.links import Links
from consensus_testkit.process import ServerHandle

START_TIMEOUT = 120.0
JVM = ("-Xms384m", "-Xmx384m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Djava.awt.headless=true")
#: A follower that fetches nothing for this long leaves the ISR (acks=all writes wait for it until then).
REPLICA_LAG_MS = 3000
#: A broker silent this long is fenced (its partitions move); a voter that hears nothing from the
#: quorum leader this long starts an election (within half of it, at random).
BROKER_SESSION_MS, QUORUM_FETCH_MS = 2000, 1500
#: Bound of one raw request of ``status`` and ``holders``.
REQUEST_TIMEOUT = 1.0
_DESCRIBE_LOG_DIRS, _FIND_COORDINATOR = 35, 10


def start_cluster(workdir: Path | None, nodes: int) -> ClusterHandle:
    """Format and start ``nodes`` KRaft nodes as one cluster and wait until every broker is
    registered and the quorum has a leader; RuntimeError with the logs' tails otherwise (nothing is
    left running then)."""
    java = java_binary()
    classpath = str(libs_dir() / "*")
    directory = Path(tempfile.mkdtemp(prefix="kafka-cluster-", dir=workdir))
    ids = range(1, nodes + 1)
    client = {n: free_port() for n in ids}
    proxied = {n: (free_port(), free_port()) for n in ids}  # node n's PROXIED port and the one it advertises
    controller = {n: free_port() for n in ids}
    inbound = {(s, n): free_port() for n in ids for s in ids}  # node n's listener FROMs
    links: dict[str, tuple[int, int]] = {}
    proxy: dict[tuple[str, int, int], int] = {}  # (kind, source, target) -> the link's proxy port
    for source in ids:
        for target in ids:
            if source != target:
                for kind, port in (("controller", controller[target]), ("broker", inbound[source, target])):
                    proxy[kind, source, target] = free_port()
                    links[link_name(source, target, kind)] = (proxy[kind, source, target], port)
    link_process = Links.start(directory / "links", links)
    cluster_id = _cluster_id()
    handles = []
    try:
        for n in ids:
            voters = ",".join(
                f"{m}@{HOST}:{controller[m] if m == n else proxy['controller', n, m]}" for m in ids
            )
            advertised = {f"FROM{s}": inbound[s, n] if s == n else proxy["broker", s, n] for s in ids}
            own = {f"FROM{s}": inbound[s, n] for s in ids}
            settings = _settings(
                n,
                nodes,
                voters=voters,
                client=client[n],
                controller=controller[n],
                own={**own, "PROXIED": proxied[n][0]},
                advertised={**advertised, "PROXIED": proxied[n][1]},
            )
            handles.append(
                _node(
                    java,
                    classpath,
                    directory / f"node{n}",
                    node=n,
                    settings=settings,
                    cluster_id=cluster_id,
                    port=client[n],
                    proxied=proxied[n],
                )
            )
    except BaseException:
        link_process.stop()
        shutil.rmtree(directory, ignore_errors=True)
        raise
    url = "kafka://" + ",".join(f"{HOST}:{client[n]}" for n in ids)
    return ClusterHandle(
        "kafka",
        url,
        handles,
        directory,
        link_process,
        status=status,
        serves_session=serves_session,
        holders=holders,
        in_sync=in_sync,
    ).start(START_TIMEOUT)


def _settings(
    node: int,
    nodes: int,
    *,
    voters: str,
    client: int,
    controller: int,
    own: Mapping[str, int],
    advertised: Mapping[str, int],
) -> dict[str, str]:
    """Node ``node``'s settings over the single node's (``kafka._server_properties``)."""
    replicas, min_isr = str(min(3, nodes)), str(min(2, nodes))
    names = ["PLAINTEXT", "CONTROLLER", *own]  # own: the FROMn listeners and PROXIED
    return {
        "node.id": str(node),
        "controller.quorum.voters": voters,
        "listeners": ",".join(
            [f"PLAINTEXT://{HOST}:{client}", f"CONTROLLER://{HOST}:{controller}"]
            + [f"{name}://{HOST}:{port}" for name, port in own.items()]
        ),
        "advertised.listeners": ",".join(
            [f"PLAINTEXT://{HOST}:{client}", f"CONTROLLER://{HOST}:{controller}"]
            + [f"{name}://{HOST}:{port}" for name, port in advertised.items()]
        ),
        "inter.broker.listener.name": f"FROM{node}",
        "listener.security.protocol.map": ",".join(f"{name}:PLAINTEXT" for name in names),
        "default.replication.factor": replicas,
        "min.insync.replicas": min_isr,
        "offsets.topic.replication.factor": replicas,
        "transaction.state.log.replication.factor": replicas,
        "transaction.state.log.min.isr": min_isr,
        "share.coordinator.state.topic.replication.factor": replicas,
        "share.coordinator.state.topic.min.isr": min_isr,
        "replica.lag.time.max.ms": str(REPLICA_LAG_MS),
        # Leadership moves on faults only, never back to a preferred replica at a random moment of a test.
        "auto.leader.rebalance.enable": "false",
        "broker.session.timeout.ms": str(BROKER_SESSION_MS),
        "broker.heartbeat.interval.ms": str(BROKER_SESSION_MS // 8),
        "controller.quorum.fetch.timeout.ms": str(QUORUM_FETCH_MS),
        "controller.quorum.election.timeout.ms": str(QUORUM_FETCH_MS // 2),
        # A link's proxy holds a connection to a dead peer open while it retries: give up on it sooner.
        "controller.quorum.request.timeout.ms": str(QUORUM_FETCH_MS * 2 // 3),
    }


def _node(
    java: str,
    classpath: str,
    directory: Path,
    *,
    node: int,
    settings: Mapping[str, str],
    cluster_id: str,
    port: int,
    proxied: tuple[int, int],
) -> ServerHandle:
    """The (formatted, not yet started) node ``node``, clients on ``port``; ``proxied``: its PROXIED
    listener's port and the port it advertises for it (``ServerHandle.proxy_port``)."""
    directory.mkdir(parents=True)
    base = _server_properties(directory, port, 0, 0, 0)
    lines = [line for line in base.splitlines() if line.partition("=")[0] not in settings]
    lines = [line for line in lines if not line.startswith("controller.quorum.bootstrap.servers=")]
    config, log4j = directory / "server.properties", directory / "log4j2.properties"
    config.write_text(
        "".join(f"{line}\n" for line in lines) + "".join(f"{k}={v}\n" for k, v in settings.items())
    )
    log4j.write_text(LOG4J2)
    common = [f"-Dlog4j2.configurationFile={log4j}", "-cp", classpath]
    handle = ServerHandle(
        "kafka",
        f"kafka://{HOST}:{port}",
        port,
        directory,
        command=[java, *JVM, *common, "kafka.Kafka", str(config)],
        probe=lambda: probe(port),
        proxy_port=proxied[1],
        proxy_target=proxied[0],
    )
    format_command = [
        java,
        *TOOL_JVM,
        *common,
        "kafka.tools.StorageTool",
        "format",
        "-t",
        cluster_id,
        "-c",
        str(config),
    ]
    run_checked(format_command, handle.log_path, f"formatting Kafka storage of node {node}", timeout=60)
    return handle


def _request(port: int, api_key: int, version: int, body: bytes) -> bytes:
    """One raw request (non-flexible header v1) to the broker at ``port``; the response body after
    the correlation id. OSError when it does not answer within ``REQUEST_TIMEOUT``."""
    client = b"consensus-test"
    header = struct.pack(">hhih", api_key, version, 1, len(client)) + client
    with socket.create_connection((HOST, port), timeout=REQUEST_TIMEOUT) as sock:
        sock.sendall(struct.pack(">i", len(header) + len(body)) + header + body)
        stream = sock.makefile("rb")
        size = struct.unpack(">i", _exactly(stream.read(4), 4))[0]
        return _exactly(stream.read(size), size)[4:]


def _exactly(data: bytes, size: int) -> bytes:
    if len(data) != size:
        raise OSError("the broker closed the connection")
    return data


def _string(data: bytes, offset: int) -> tuple[str, int]:
    """The (non-null) protocol string at ``offset`` and the offset after it."""
    length = struct.unpack_from(">h", data, offset)[0]
    return data[offset + 2 : offset + 2 + length].decode(), offset + 2 + max(0, length)


def _log_dir(port: int) -> Path | None:
    """The log dir of the broker at ``port`` (DescribeLogDirs v1), or None when it does not answer."""
    try:
        answer = _request(port, _DESCRIBE_LOG_DIRS, 1, struct.pack(">i", -1))
        if struct.unpack_from(">i", answer, 4)[0] < 1:
            return None
        return Path(_string(answer, 10)[0])
    except (OSError, struct.error, UnicodeDecodeError):
        return None


def status(port: int) -> NodeStatus | None:
    """The KRaft role (``leader``: the active controller; ``follower``; ``candidate`` while it knows
    no leader) and the epoch of the node whose clients use ``port``; None when it does not answer."""
    logs = _log_dir(port)
    if logs is None:
        return None
    try:
        node = _node_id(logs)
        state = json.loads((logs / "__cluster_metadata-0" / "quorum-state").read_text())
        leader, epoch = int(state["leaderId"]), int(state["leaderEpoch"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    role = LEADER if leader == node else FOLLOWER if leader >= 0 else "candidate"
    return NodeStatus(role, epoch)


def _node_id(logs: Path) -> int:
    """The node id in ``meta.properties`` of the log dir ``logs``."""
    for line in (logs / "meta.properties").read_text().splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "node.id":
            return int(value)
    raise ValueError(f"no node.id in {logs / 'meta.properties'}")


def group_coordinator(port: int, group_id: str) -> int | None:
    """The node id coordinating ``group_id``, as the broker at ``port`` says (FindCoordinator v1)."""
    key = group_id.encode()
    try:
        answer = _request(port, _FIND_COORDINATOR, 1, struct.pack(">h", len(key)) + key + b"\x00")
        error, message_length = struct.unpack_from(">hh", answer, 4)
        node: int = struct.unpack_from(">i", answer, 8 + max(0, message_length))[0]
    except (OSError, struct.error):
        return None
    return node if error == 0 and node >= 0 else None


def log_leader(port: int, topic: str) -> int | None:
    """The node id leading partition 0 of ``topic``, as the broker at ``port`` says."""
    admin = admin_client(port)
    if admin is None:
        return None
    try:
        [described] = admin.describe_topics([topic])
        leaders = [p["leader_id"] for p in described["partitions"] if p["partition_index"] == 0]
    except (KafkaError, KeyError, ValueError):
        return None
    finally:
        admin.close()
    return int(leaders[0]) if leaders and leaders[0] >= 0 else None


def in_sync(port: int) -> bool | None:
    """Whether every partition of every topic has all its replicas in its ISR, as the broker at
    ``port`` says; None if it does not answer."""
    admin = admin_client(port)
    if admin is None:
        return None
    try:
        topics = admin.describe_topics()
        return all(
            set(partition["isr_nodes"]) == set(partition["replica_nodes"])
            for topic in topics
            for partition in topic["partitions"]
        )
    except (KafkaError, KeyError, ValueError):
        return None
    finally:
        admin.close()


def holders(port: int, identity: Mapping[str, Any]) -> dict[str, int]:
    """The roles a Kafka session depends on and the node ids holding them, as the broker at ``port``
    says (``cluster.SESSION_ROLES``): ``"coordinator"`` (the group coordinator of its first group
    member) and ``"log leader"`` (the leader of its command-log partition)."""
    found: dict[str, int] = {}
    members = identity.get("members") or []
    if members and (node := group_coordinator(port, str(members[0][0]))) is not None:
        found["coordinator"] = node
    topic = identity.get("topic")
    if isinstance(topic, str) and (node := log_leader(port, topic)) is not None:
        found["log leader"] = node
    return found


def serves_session(port: int, identity: Mapping[str, Any]) -> bool:
    """Whether the node at ``port`` leads the session's command-log partition (the broker its
    liveness probe and every write go to)."""
    logs = _log_dir(port)
    if logs is None:
        return False
    try:
        node = _node_id(logs)
    except (OSError, ValueError):
        return False
    return holders(port, identity).get("log leader") == node
