"""A replicated cluster of real servers on loopback: one ``ServerHandle`` per node, the links between
the nodes through proxies (``consensus_testkit.links``), and which node leads.

Nodes are numbered from 1. Every node is a real server process on free ports,
controlled by PID like a single server (``ServerHandle``); the cluster's URL
names every node's client endpoint and ``node_url(n)`` a single node's (a
session pinned to it). Every node reaches its peers through one proxy per
directed link, so ``isolate(n)`` partitions a running node from the others
(connections stay open, nothing flows) and ``heal()`` ends the partition.

``ClusterHandle`` also offers the whole-server interface of ``ServerHandle``
(``kill``, ``pause``, ``resume``, ``restart``, ``spawn``, ``wait_ready``, ``stop``
without a node: every node), so the single-server fault tests and chaos runs
drive a cluster unchanged; with a node they act on that node only.

A launcher that starts clusters declares a ``consensus_testkit.launchers.ClusterLauncher``:
``start(workdir, nodes)``, ``status(port) -> NodeStatus | None`` (the node's role
and the server-side term it knows), ``serves_session(port, identity) -> bool``
(whether the node holds the client connection of the session
``Backend.fault_identity()`` describes), and optionally ``holders(port, identity)
-> {role: node}`` (the nodes holding the session's ``SESSION_ROLES``).

``write_control(path)`` describes the cluster in a JSON control file (every
node's own control file beside it, the links' socket); ``ClusterHandle.attach``
rebuilds a handle in another process.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from consensus_testkit.host import HOST
from consensus_testkit.links import Links
from consensus_testkit.process import ServerHandle

#: Roles a node reports (``NodeStatus.role``); anything else (looking, candidate...) does not serve.
LEADER, FOLLOWER = "leader", "follower"
#: Roles a server may hold for one session, besides leading (``ClusterHandle.holders``): the node
#: coordinating its group membership, the node leading the log its writes go to.
SESSION_ROLES = ("coordinator", "log leader")
#: How often ``wait_ready`` and ``wait_leader`` ask the nodes.
POLL = 0.05
#: Between two asks whether every replica is in sync (each one opens a client).
IN_SYNC_POLL = 0.25


@dataclass(frozen=True)
class NodeStatus:
    """What a node says of itself: its role and the server-side term it knows (ZooKeeper: the epoch
    of its last zxid; etcd: the raft term)."""

    role: str
    term: int | None


def link_name(source: int, target: int, kind: str) -> str:
    """The name of the link from node ``source`` to ``kind`` port of node ``target``."""
    return f"{source}>{target}:{kind}"


def links_of(names: Iterable[str], node: int) -> list[str]:
    """The links in ``names`` into or out of ``node``."""
    chosen = []
    for name in names:
        ends = name.partition(":")[0].split(">")
        if str(node) in ends:
            chosen.append(name)
    return chosen


class ClusterHandle:
    """A running cluster (see the module docstring)."""

    def __init__(
        self,
        name: str,
        url: str,
        nodes: Sequence[ServerHandle],
        directory: Path,
        links: Links,
        *,
        status: Callable[[int], NodeStatus | None],
        serves_session: Callable[[int, Mapping[str, Any]], bool],
        holders: Callable[[int, Mapping[str, Any]], dict[str, int]] | None = None,
        in_sync: Callable[[int], bool | None] | None = None,
    ) -> None:
        self.name = name
        self.url = url
        self.nodes = list(nodes)
        self.directory = directory
        self.links = links
        self.host = HOST
        #: The first node's client port: a proxy in front of the cluster fronts that node.
        self.port = self.nodes[0].port
        self.proxy_port = self.nodes[0].proxy_port
        self.proxy_target = self.nodes[0].proxy_target
        self._status = status
        self._serves_session = serves_session
        self._holders = holders
        self._in_sync = in_sync
        self._control: Path | None = None

    def __repr__(self) -> str:
        return f"<ClusterHandle {self.name} of {len(self.nodes)} nodes at {self.directory}>"

    # Nodes

    @property
    def fronts(self) -> list[tuple[int, int]]:
        """Node 1's proxy front (``ServerHandle.fronts``), then every other node's that advertises a
        proxied listener (Kafka: a client that bootstraps through node 1's proxy is told of every
        broker at its own proxy's port)."""
        first, *others = self.nodes
        return first.fronts + [
            front for node in others if node.proxy_port is not None for front in node.fronts
        ]

    @property
    def ids(self) -> list[int]:
        """The node numbers, from 1."""
        return list(range(1, len(self.nodes) + 1))

    def node(self, number: int) -> ServerHandle:
        """The handle of node ``number`` (from 1); ValueError for another number."""
        if number not in self.ids:
            raise ValueError(f"no node {number} in a cluster of {len(self.nodes)}")
        return self.nodes[number - 1]

    def node_url(self, number: int) -> str:
        """The cluster's URL naming node ``number`` only: a session pinned to that node."""
        return self.node(number).url

    def status(self, number: int) -> NodeStatus | None:
        """What node ``number`` says of itself, or None when it does not answer (dead, paused)."""
        return self._status(self.node(number).port)

    def leader(self) -> int | None:
        """The node that says it leads, or None (several claim it or none does)."""
        leaders = [n for n in self.ids if (s := self.status(n)) is not None and s.role == LEADER]
        return leaders[0] if len(leaders) == 1 else None

    def wait_leader(self, timeout: float, among: Iterable[int] | None = None) -> int:
        """Wait until one node of ``among`` (default: all) leads and a majority serves; its number.
        RuntimeError after ``timeout`` with every node's status."""
        candidates = set(self.ids if among is None else among)
        deadline = time.monotonic() + timeout
        while True:
            statuses = {n: self.status(n) for n in self.ids}
            roles = {n: status.role for n, status in statuses.items() if status is not None}
            serving = [n for n, role in roles.items() if role in (LEADER, FOLLOWER)]
            leaders = [n for n in serving if roles[n] == LEADER]
            if len(leaders) == 1 and leaders[0] in candidates and len(serving) > len(self.nodes) // 2:
                return leaders[0]
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{self.name}: no leader among {sorted(candidates)} after {timeout}s: {statuses}"
                )
            time.sleep(POLL)

    def serving(self, identity: Mapping[str, Any]) -> int | None:
        """The node holding the client connection of the session ``identity`` describes
        (``Backend.fault_identity()``), or None."""
        return next((n for n in self.ids if self._serves_session(self.node(n).port, identity)), None)

    def holders(self, identity: Mapping[str, Any]) -> dict[str, int]:
        """The session roles of ``identity`` (``SESSION_ROLES``) and the nodes holding them, as the first
        node that answers says; empty when the launcher names none or no node answers."""
        if self._holders is None:
            return {}
        for handle in self.nodes:
            if found := self._holders(handle.port, identity):
                return found
        return {}

    # Faults: on one node, or on every node when ``node`` is None

    def _chosen(self, node: int | None) -> list[ServerHandle]:
        return self.nodes if node is None else [self.node(node)]

    def kill(self, node: int | None = None) -> None:
        """SIGKILL node ``node`` (every node when None); data dirs are kept."""
        for handle in self._chosen(node):
            handle.kill()

    def pause(self, node: int | None = None) -> None:
        """SIGSTOP node ``node`` (every node when None)."""
        for handle in self._chosen(node):
            handle.pause()

    def resume(self, node: int | None = None) -> None:
        """SIGCONT node ``node`` (every node when None)."""
        for handle in self._chosen(node):
            handle.resume()

    def spawn(self, node: int | None = None) -> None:
        """Start node ``node`` (every node not running when None) without waiting."""
        for handle in self._chosen(node):
            if not handle.running():
                handle.spawn()

    def restart(self, timeout: float = 60, node: int | None = None) -> None:
        """Kill and start node ``node`` (every node when None), then wait until the cluster serves
        and, where data is replicated outside the quorum (Kafka's partitions), every replica is in
        sync again: what a rolling restart waits for before its next node."""
        deadline = time.monotonic() + timeout
        self.kill(node)
        self.spawn(node)
        self.wait_ready(timeout)
        self.wait_in_sync(max(0.1, deadline - time.monotonic()))

    def wait_in_sync(self, timeout: float) -> None:
        """Block until a node reports every replica in sync (at once for backends without replicas
        outside their quorum); RuntimeError after ``timeout``."""
        if self._in_sync is None:
            return
        deadline = time.monotonic() + timeout
        while True:
            for handle in self.nodes:
                answer = self._in_sync(handle.port) if handle.running() else None
                if answer is not None:
                    if answer:
                        return
                    break  # one node's view of the cluster's metadata is enough
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} cluster: replicas not in sync after {timeout:g}s")
            time.sleep(IN_SYNC_POLL)

    def running(self) -> bool:
        """True while every node's process exists (paused counts as running)."""
        return all(handle.running() for handle in self.nodes)

    def wait_ready(self, timeout: float) -> None:
        """Block until every node runs and serves (one leader, the others following); RuntimeError
        with the statuses after ``timeout``."""
        deadline = time.monotonic() + timeout
        for handle in self.nodes:
            handle.wait_ready(max(0.1, deadline - time.monotonic()))
        while True:
            statuses = [self.status(n) for n in self.ids]
            roles = sorted(s.role if s is not None else "none" for s in statuses)
            if roles == sorted([LEADER] + [FOLLOWER] * (len(self.nodes) - 1)):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} cluster not serving after {timeout}s: {statuses}")
            time.sleep(POLL)

    def start(self, timeout: float) -> Self:
        """Spawn every node and wait until the cluster serves (``wait_ready``); if it does not, stop
        everything (data removed) and raise."""
        try:
            for handle in self.nodes:
                handle.spawn()
            self.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def isolate(self, node: int) -> None:
        """Partition node ``node`` from the others: its links stall (connections stay open); clients
        still reach it."""
        self.node(node)  # ValueError for a number not in the cluster
        self.links.stall(links_of(self.links.names, node))

    def heal(self, node: int | None = None) -> None:
        """End the partition of node ``node`` (of every node when None)."""
        self.links.heal(None if node is None else links_of(self.links.names, node))

    # Life cycle and control files

    def stop(self) -> None:
        """Stop every node and the links; removes the data. Idempotent."""
        for handle in self.nodes:
            handle.stop()
        self.links.stop()
        if self._control is not None:
            self._control.unlink(missing_ok=True)
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def write_control(self, path: Path) -> None:
        """Describe the cluster in the JSON file ``path``, every node's control file beside it."""
        nodes = []
        for number, handle in zip(self.ids, self.nodes, strict=True):
            node_control = path.with_name(f"{path.stem}-node{number}.json")
            handle.write_control(node_control)
            nodes.append({"id": number, "control": str(node_control), "port": handle.port, "url": handle.url})
        data = {
            "name": self.name,
            "cluster": True,
            "url": self.url,
            "host": self.host,
            "port": self.port,
            "directory": str(self.directory),
            "nodes": nodes,
            "links": self.links.describe(),
        }
        staging = path.with_name(path.name + ".tmp")
        staging.write_text(json.dumps(data, indent=1))
        os.replace(staging, path)
        self._control = path

    @classmethod
    def attach(
        cls,
        path: Path,
        attach_node: Callable[[Path], ServerHandle],
        launcher: Callable[[str], Any],
    ) -> ClusterHandle:
        """A handle on the cluster the control file ``path`` describes: ``attach_node`` rebuilds each
        node's handle, ``launcher(name).cluster`` reads the nodes (``consensus_testkit.control``
        passes both); ValueError when it is unreadable or describes no cluster."""
        try:
            data = json.loads(Path(path).read_text())
            if not data.get("cluster"):
                raise ValueError("not a cluster's control file")
            nodes = [attach_node(Path(node["control"])) for node in data["nodes"]]
            name = str(data["name"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"unreadable cluster control file {path}: {exc}") from None
        cluster = launcher(name).cluster
        if cluster is None:
            raise ValueError(f"cluster control file {path} names {name!r}, whose launcher starts no cluster")
        return cls(
            name,
            str(data["url"]),
            nodes,
            Path(data["directory"]),
            Links.attach(data["links"]),
            status=cluster.status,
            serves_session=cluster.serves_session,
            holders=cluster.holders,
        )


def is_cluster_control(path: Path) -> bool:
    """Whether the control file ``path`` describes a cluster (False when unreadable)."""
    try:
        return bool(json.loads(Path(path).read_text()).get("cluster"))
    except (OSError, ValueError, AttributeError):
        return False
