"""Replicated clusters from consensus_testkit: the links process, the ZooKeeper ensemble, its control
file, `consensus servers run --nodes` and the ``cluster`` marker of the test profiles (real servers only)."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner
from cluster_support import FAILOVER, is_zombie, run_under_servers
from kazoo.client import KazooClient

from consensus_api.cli import cli
from consensus_api.errors import ConfigurationError
from consensus_chaos.record.runner import ChaosOptions
from consensus_testkit import start_cluster
from consensus_testkit.cluster import ClusterHandle, link_name, links_of
from consensus_testkit.host import HOST, free_port
from consensus_testkit.links import Links
from consensus_testkit.profile import SINGLE_SERVER, profile_for


def test_links_stall_and_heal_by_name_from_another_handle(echo_port: int, tmp_path: Path) -> None:
    """A stalled link forwards nothing (its connection stays open); healed, the bytes arrive; a handle
    attached from ``describe()`` controls the same process; unknown names are refused before any I/O."""
    listen = free_port()
    links = Links.start(tmp_path / "links", {link_name(1, 2, "quorum"): (listen, echo_port)})
    try:
        other = Links.attach(json.loads(json.dumps(links.describe())))
        with socket.create_connection((HOST, listen), timeout=5) as client:
            client.sendall(b"a")
            assert client.recv(1) == b"a"
            other.stall(links_of(other.names, 2))
            client.sendall(b"b")
            client.settimeout(0.5)
            with pytest.raises(TimeoutError):
                client.recv(1)
            other.heal()
            client.settimeout(5)
            assert client.recv(1) == b"b"
        with pytest.raises(ValueError, match="unknown links"):
            other.stall(["9>1:quorum"])
    finally:
        links.stop()
    assert links.pid is not None
    assert is_zombie(links.pid)


def test_links_of_picks_the_links_of_one_node() -> None:
    names = [link_name(a, b, kind) for a in (1, 2, 3) for b in (1, 2, 3) if a != b for kind in ("q", "e")]
    assert sorted(links_of(names, 3)) == sorted(n for n in names if "3" in n.partition(":")[0])
    assert len(links_of(names, 3)) == 8


def test_start_cluster_refuses_what_it_cannot_start() -> None:
    with pytest.raises(
        ConfigurationError, match=r"no cluster launcher for 'postgresql'; clusters: .*zookeeper"
    ):
        start_cluster("postgresql")
    with pytest.raises(ConfigurationError, match="odd number"):
        start_cluster("zookeeper", 2)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["zookeeper", "--nodes", "2"], "odd and at least 3"),
        (["zookeeper", "etcd", "--nodes", "3"], "starts one server whose launcher starts clusters"),
        (["postgresql", "--nodes", "3"], "starts one server whose launcher starts clusters"),
        (["zookeeper", "--secure", "--nodes", "3"], "without --secure"),
    ],
)
def test_servers_run_nodes_usage_errors(args: list[str], message: str) -> None:
    result = CliRunner().invoke(cli, ["servers", "run", *args, "--", "true"])
    assert result.exit_code == 2, result.output
    assert message in result.output


def test_cluster_marker_is_declared_for_single_servers_and_backends_without_a_launcher() -> None:
    assert profile_for("zookeeper://127.0.0.1:2181").not_applicable["cluster"] == SINGLE_SERVER
    assert "cluster" not in profile_for("zookeeper://127.0.0.1:1,127.0.0.1:2").not_applicable
    assert "cluster" not in profile_for("etcd://127.0.0.1:1,127.0.0.1:2").not_applicable
    assert "cluster" not in profile_for("kafka://127.0.0.1:1,127.0.0.1:2").not_applicable
    assert "cluster" in profile_for("mariadb://u:p@127.0.0.1:1,127.0.0.1:2/db").not_applicable
    assert profile_for("postgresql://u@127.0.0.1:1,127.0.0.1:2/db").not_applicable["cluster"]


def test_zookeeper_ensemble_under_servers_run(tmp_path: Path) -> None:
    """``consensus servers run zookeeper --nodes 3``: the URL names three nodes, the control file each
    node; a process attached to it finds the leader, kills it and restarts it; the others elect a new
    leader in a higher epoch; a write through one node is read through another; nothing is left."""
    run_under_servers(
        tmp_path,
        "zookeeper",
        "from kazoo.client import KazooClient\n"
        + FAILOVER
        + "a, b = (KazooClient(hosts=cluster.node_url(n).split('//')[1]) for n in (leader, new))\n"
        "a.start(10); b.start(10)\n"
        "a.create('/x', b'1'); b.sync('/x')\n"
        "assert b.get('/x')[0] == b'1'\n"
        "a.stop(); b.stop()\n",
        timeout=240,
    )


def test_cluster_handle_pins_sessions_and_isolates_a_node(zookeeper_cluster: ClusterHandle) -> None:
    """A session pinned to a node is served by that node (``serving``); an isolated follower stops
    serving within a few seconds, the others keep serving; healed, it follows again."""
    cluster = zookeeper_cluster
    leader = cluster.wait_leader(30)
    follower = next(n for n in cluster.ids if n != leader)
    client = KazooClient(hosts=cluster.node_url(follower).split("//")[1], timeout=10)
    client.start(10)
    try:
        identity = {"session_id": client.client_id[0]}
        assert cluster.serving(identity) == follower
        cluster.isolate(follower)
        _until(lambda: cluster.status(follower) is None, 15)
        assert cluster.leader() == leader
        cluster.heal()
        cluster.wait_ready(30)
    finally:
        client.stop()
        client.close()


def _until(check: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


@pytest.mark.parametrize(
    ("server", "nodes", "faults", "message"),
    [
        ("zookeeper", 1, {"leader-kill"}, "need --nodes 3"),
        ("mariadb", 3, {"kill"}, "--nodes needs"),
        ("zookeeper", 4, {"partition"}, "--nodes needs"),
    ],
)
def test_chaos_cluster_options_are_checked_before_anything_starts(
    server: str, nodes: int, faults: set[str], message: str, tmp_path: Path
) -> None:
    options = ChaosOptions(
        url=None,
        server=server,
        duration=1,
        clients=1,
        keys=1,
        faults=frozenset(faults),
        out=tmp_path,
        nodes=nodes,
    )
    with pytest.raises(ConfigurationError, match=message):
        options.validate()
