"""Real servers from consensus_testkit, driven by real clients (no mocks)."""

from __future__ import annotations

import random
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from importlib.metadata import entry_points
from pathlib import Path

import psutil
import psycopg
import pyetcd
import pytest
from click.testing import CliRunner
from kafka import KafkaConsumer, KafkaProducer
from kafka.admin import KafkaAdminClient
from kafka.errors import KafkaError
from kazoo.client import KazooClient
from kazoo.protocol.states import KazooState

from consensus_api.errors import ConfigurationError
from consensus_backends.etcd.testkit.server import BINARY_VARIABLE as ETCD_BINARY_VARIABLE
from consensus_backends.etcd.testkit.server import ETCD_VERSION
from consensus_backends.etcd.testkit.server import probe as etcd_probe
from consensus_backends.zookeeper.testkit.profile import expire_zookeeper_session
from consensus_chaos.cli.chaos import chaos
from consensus_testkit import ServerHandle, host, server_names, start_server
from consensus_testkit.host import tcp_request
from consensus_testkit.launchers import GROUP as LAUNCHER_GROUP
from consensus_testkit.launchers import store_names
from consensus_testkit.prerequisites import NotInstalledError
from consensus_testkit.process import launch


def _gone(pid: int) -> bool:
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


def _eventually(check: Callable[[], bool], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def _stop_and_check(server: ServerHandle) -> None:
    """stop() leaves no process of the server and removes its dir; a second stop() is a no-op."""
    pids = [server.pid, *(p.pid for p in psutil.Process(server.pid).children(recursive=True))]
    server.stop()
    assert all(_gone(pid) for pid in pids)
    assert not server.directory.exists()
    server.stop()


def _kill_and_check(server: ServerHandle) -> None:
    pid = server.pid
    server.kill()
    assert _gone(pid)
    assert server.directory.exists()


@pytest.fixture
def started() -> Iterator[Callable[..., ServerHandle]]:
    """Start servers for one test; stops whatever the test did not."""
    servers: list[ServerHandle] = []

    def start(name: str, workdir: Path | None = None) -> ServerHandle:
        servers.append(start_server(name, workdir))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


def test_names_and_unknown_server() -> None:
    # every launcher is found by its entry point, the built-in ones as the plugin's (CI installs
    # consensus-redis); an unknown name is a ConfigurationError naming the known ones
    assert set(server_names()) == {ep.name for ep in entry_points(group=LAUNCHER_GROUP)}
    assert {"postgresql", "mariadb", "zookeeper", "etcd", "kafka", "redis"} <= set(server_names())
    with pytest.raises(ConfigurationError, match="unknown server 'mysql'; known: sqlite, etcd"):
        start_server("mysql")


def test_a_tool_server_is_not_a_store() -> None:
    # Spark serves `consensus check --master`: `consensus servers run spark` starts it, but nothing
    # offers it as a store to run a workload or the conformance suite against
    assert "spark" in server_names()
    assert "spark" not in store_names()
    assert {"sqlite", "postgresql", "mariadb", "zookeeper", "etcd", "kafka", "redis"} <= set(store_names())
    result = CliRunner().invoke(chaos, ["--server", "spark", "--duration", "1"])
    assert result.exit_code == 2
    assert "'spark' is not one of" in result.output


def test_failed_start_raises_with_log_tail_and_cleans_up(tmp_path: Path) -> None:
    crashing = ServerHandle(
        "crash",
        "crash://",
        1,
        tmp_path / "crash",
        command=["sh", "-c", "echo boom; exit 3"],
        probe=lambda: False,
    )
    crashing.directory.mkdir()
    with pytest.raises(RuntimeError, match=r"(?s)exited \(code 3\).*boom"):
        launch(crashing, 5)
    assert not crashing.directory.exists()

    pids: list[int] = []

    def never_ready() -> bool:
        pids.append(hanging.pid)
        return False

    hanging = ServerHandle(
        "hang",
        "hang://",
        1,
        tmp_path / "hang",
        command=["sh", "-c", "echo waiting; exec sleep 60"],
        probe=never_ready,
    )
    hanging.directory.mkdir()
    with pytest.raises(RuntimeError, match=r"(?s)not ready after 0.5s.*waiting"):
        launch(hanging, 0.5)
    assert pids
    assert _gone(pids[0])
    assert not hanging.directory.exists()


def _spawn_with_pid(pid: int, attempts: int = 50) -> subprocess.Popen[bytes]:
    """A ``sleep`` process that the kernel gave ``pid``: the PID of a process that ended and was
    reaped is handed out again (as it is within minutes on a busy machine). Root: ns_last_pid."""
    for _ in range(attempts):
        Path("/proc/sys/kernel/ns_last_pid").write_text(str(pid - 1))
        process = subprocess.Popen(["sleep", "60"])
        if process.pid == pid:
            return process
        process.kill()
        process.wait()
    raise AssertionError(f"the kernel did not hand out PID {pid} again in {attempts} attempts")


@pytest.mark.parametrize("action", ["pause", "kill", "stop"])
def test_a_server_pid_handed_to_another_process_is_never_signalled(tmp_path: Path, action: str) -> None:
    """The server dies and is reaped behind the handle's back (killed by another process, as a test
    process kills a server it attached to), and its PID goes to an unrelated process: pausing,
    killing or stopping the server leaves that process alone."""
    server = ServerHandle(
        "sleeper", "sleeper://", 1, tmp_path / "sleeper", command=["sleep", "600"], probe=lambda: True
    )
    server.directory.mkdir()
    launch(server, 5)
    server.write_control(tmp_path / "control.json")  # its reaper thread reaps the server when it dies
    time.sleep(0.1)  # a process is known by PID and start time, which the kernel counts in 10 ms ticks
    pid = server.pid
    psutil.Process(pid).kill()
    _eventually(lambda: not psutil.pid_exists(pid))
    bystander = _spawn_with_pid(pid)
    try:
        getattr(server, action)()
        time.sleep(0.2)
        assert bystander.poll() is None, f"{action} signalled the process that reused PID {pid}"
        assert psutil.Process(pid).status() != psutil.STATUS_STOPPED, f"{action} stopped PID {pid}"
    finally:
        bystander.kill()
        bystander.wait()
        server.stop()


def test_postgresql(started: Callable[..., ServerHandle], tmp_path: Path) -> None:
    server = started("postgresql", tmp_path)
    assert server.url == f"postgresql+psycopg://postgres@127.0.0.1:{server.port}/postgres"
    assert server.directory.parent == tmp_path
    dsn = f"host={server.host} port={server.port} user=postgres dbname=postgres connect_timeout=2"
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert conn.execute("select 1").fetchone() == (1,)
        conn.execute("create table t (k text primary key)")
        conn.execute("insert into t values ('kept')")

    _kill_and_check(server)
    server.restart()
    with psycopg.connect(dsn) as conn:
        assert conn.execute("select k from t").fetchall() == [("kept",)]

    server.pause()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(dsn).close()
    server.resume()
    with psycopg.connect(dsn) as conn:
        assert conn.execute("select count(*) from t").fetchone() == (1,)
    _stop_and_check(server)


def test_zookeeper(started: Callable[..., ServerHandle]) -> None:
    server = started("zookeeper")
    hosts = f"{server.host}:{server.port}"
    assert server.url == f"zookeeper://{hosts}"
    client = KazooClient(hosts=hosts, timeout=4.0)
    client.start(timeout=10)
    try:
        client.create("/kept", b"v1")
        assert client.get("/kept")[0] == b"v1"
    finally:
        client.stop()
        client.close()

    _kill_and_check(server)
    server.restart()
    server.pause()
    assert tcp_request(server.port, b"srvr", timeout=1.0) == b""
    server.resume()
    client = KazooClient(hosts=hosts, timeout=4.0)
    client.start(timeout=10)
    try:
        assert client.get("/kept")[0] == b"v1"
    finally:
        client.stop()
        client.close()
    _stop_and_check(server)


def test_zookeeper_real_session_expiry(started: Callable[..., ServerHandle]) -> None:
    server = started("zookeeper")
    hosts = f"{server.host}:{server.port}"
    victim, observer = KazooClient(hosts=hosts, timeout=4.0), KazooClient(hosts=hosts, timeout=4.0)
    states: list[str] = []
    victim.add_listener(states.append)
    victim.start(timeout=10)
    observer.start(timeout=10)
    try:
        victim.create("/eph", b"", ephemeral=True)
        old_session = victim.client_id[0]
        expire_zookeeper_session(hosts, *victim.client_id)
        _eventually(lambda: observer.exists("/eph") is None, timeout=3)
        _eventually(lambda: KazooState.LOST in states)
        _eventually(lambda: victim.connected and victim.client_id[0] != old_session)
    finally:
        for client in (victim, observer):
            client.stop()
            client.close()


def test_etcd(started: Callable[..., ServerHandle]) -> None:
    server = started("etcd")
    assert server.url == f"etcd://{server.host}:{server.port}"

    def client() -> pyetcd.MultiEndpointEtcd3Client:
        endpoint = pyetcd.Endpoint(server.host, server.port, secure=False, time_retry=0.5)
        return pyetcd.MultiEndpointEtcd3Client(endpoints=[endpoint], timeout=5)

    etcd = client()
    assert etcd.status().version == ETCD_VERSION
    etcd.put("/kept", "v1")
    assert etcd.get("/kept")[0] == b"v1"
    etcd.close()

    _kill_and_check(server)
    server.restart()
    server.pause()
    assert not etcd_probe(server.port)
    server.resume()
    etcd = client()
    assert etcd.get("/kept")[0] == b"v1"
    etcd.close()
    _stop_and_check(server)


def test_etcd_without_binary_names_the_installer(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CONSENSUS_CACHE", str(tmp_path))
    monkeypatch.delenv(ETCD_BINARY_VARIABLE, raising=False)
    installer = r"run `consensus servers install etcd`"
    with pytest.raises(NotInstalledError, match=rf"etcd needs etcd {ETCD_VERSION} .*: {installer}"):
        start_server("etcd", tmp_path)
    monkeypatch.setenv(ETCD_BINARY_VARIABLE, str(tmp_path / "elsewhere" / "etcd"))
    with pytest.raises(NotInstalledError, match=rf"\$CONSENSUS_ETCD_BINARY naming a binary\): {installer}"):
        start_server("etcd", tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_kafka(started: Callable[..., ServerHandle]) -> None:
    server = started("kafka")
    bootstrap = f"{server.host}:{server.port}"
    assert server.url == f"kafka://{bootstrap}"
    topic = f"t-{uuid.uuid4().hex[:8]}"
    with KafkaAdminClient(bootstrap_servers=bootstrap) as admin:
        admin.create_topics({topic: {"num_partitions": 1, "replication_factor": 1}}, wait_for_metadata=True)
        assert topic in admin.list_topics()
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    producer.send(topic, b"kept").get(timeout=10)
    producer.close()

    _kill_and_check(server)
    server.restart()
    server.pause()
    with pytest.raises(KafkaError):
        KafkaAdminClient(bootstrap_servers=bootstrap, bootstrap_timeout_ms=1000, request_timeout_ms=1000)
    server.resume()
    consumer = KafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", consumer_timeout_ms=15000
    )
    try:
        assert next(iter(consumer)).value == b"kept"
    finally:
        consumer.close()
    _stop_and_check(server)


def test_kafka_without_jars_names_the_installer(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CONSENSUS_CACHE", str(tmp_path))
    with pytest.raises(
        NotInstalledError, match=r"kafka needs the Kafka .* jars .*: run `consensus servers install kafka`"
    ):
        start_server("kafka", tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_a_port_another_test_process_just_took_is_not_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    take = "from consensus_testkit.host import free_port; print(free_port(), flush=True); input()"
    child = subprocess.Popen(
        [sys.executable, "-c", take], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        taken = int(child.stdout.readline())
        draws = iter([taken, taken])
        fallback = random.randint
        monkeypatch.setattr(random, "randint", lambda low, high: next(draws, None) or fallback(low, high))
        assert host.free_port() != taken  # free to bind, but claimed by the other process
    finally:
        child.kill()
        child.wait(10)
