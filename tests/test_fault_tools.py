"""The fault tools of consensus_testkit: the TCP proxy, network namespaces, server control files and
the backends' test profiles (no mocks)."""

from __future__ import annotations

import json
import os
import queue
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import psutil
import pytest

from consensus_api import registry
from consensus_api.config import parse_url
from consensus_api.errors import ConfigurationError
from consensus_backends.etcd.testkit.server import probe
from consensus_testkit import start_server
from consensus_testkit.control import attach_server
from consensus_testkit.host import HOST
from consensus_testkit.netns import NetworkNamespace, why_unavailable
from consensus_testkit.profile import TestProfile, moved_to_free_port, profile_for
from consensus_testkit.proxy import TcpProxy


def _roundtrip(sock: socket.socket, payload: bytes, timeout: float = 2.0) -> bytes:
    sock.settimeout(timeout)
    sock.sendall(payload)
    return sock.recv(4096)


def _broken(sock: socket.socket) -> bool:
    """True if the connection was reset or closed: nothing comes back, without waiting long."""
    try:
        return _roundtrip(sock, b"ping", timeout=1) == b""
    except (ConnectionError, TimeoutError):
        return True


def test_proxy_forwards_stalls_drops_and_heals(echo_port: int) -> None:
    with TcpProxy(echo_port) as proxy:
        assert proxy.url_for("etcd://u:p@127.0.0.1:1/app?x=1") == f"etcd://u:p@127.0.0.1:{proxy.port}/app?x=1"
        client = socket.create_connection((HOST, proxy.port), timeout=2)
        assert _roundtrip(client, b"one") == b"one"

        proxy.stall()
        with pytest.raises(TimeoutError):
            _roundtrip(client, b"two", timeout=0.5)
        proxy.heal()
        client.settimeout(2)
        assert client.recv(4096) == b"two"  # stalled bytes flow once healed, as after a partition

        proxy.drop()
        assert _broken(client)
        try:
            refused = socket.create_connection((HOST, proxy.port), timeout=2)
        except ConnectionError:
            pass  # reset while connecting
        else:
            assert _broken(refused)
            refused.close()
        proxy.heal()
        again = socket.create_connection((HOST, proxy.port), timeout=2)
        assert _roundtrip(again, b"five") == b"five"
        for sock in (client, again):
            sock.close()


def test_proxy_listens_on_a_given_port(echo_port: int) -> None:
    with TcpProxy(echo_port) as first:
        port = first.port
    with TcpProxy(echo_port, listen_port=port) as second:  # the port is free again after close
        assert second.port == port
        with socket.create_connection((HOST, port), timeout=2) as client:
            assert _roundtrip(client, b"x") == b"x"


#: Inside the namespace: sends each stdin line to 127.0.0.1:PORT, prints what comes back ("EOF" at the end).
ECHO_CLIENT = """
import socket, sys, threading
sock = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5)
sock.settimeout(None)
def pump():
    while data := sock.recv(4096):
        print(data.decode().strip(), flush=True)
    print("EOF", flush=True)
threading.Thread(target=pump, daemon=True).start()
for line in sys.stdin:
    sock.sendall(line.encode())
"""


def _lines(stream: Iterator[str]) -> queue.Queue[str]:
    """The lines of ``stream``, read by a daemon thread."""
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        for line in stream:
            lines.put(line.strip())

    threading.Thread(target=read, daemon=True).start()
    return lines


def _ip_lists(*args: str) -> str:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10, check=True).stdout


def test_network_namespace_cuts_and_heals_real_tcp(echo_port: int) -> None:
    assert why_unavailable() is None, why_unavailable()
    with NetworkNamespace() as netns:
        netns.forward(echo_port, echo_port)
        client = subprocess.Popen(
            [*netns.prefix, sys.executable, "-c", ECHO_CLIENT, str(echo_port)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert client.stdin is not None and client.stdout is not None
        replies = _lines(client.stdout)
        client.stdin.write("one\n")
        client.stdin.flush()
        assert replies.get(timeout=10) == "one"

        netns.cut()
        client.stdin.write("two\n")
        client.stdin.flush()
        with pytest.raises(queue.Empty):  # silence: no reply, and no reset or error (that would print EOF)
            replies.get(timeout=2)
        assert client.poll() is None
        netns.heal()
        assert replies.get(timeout=15) == "two"  # retransmitted by TCP once the link is up
        assert client.poll() is None
        name, link = netns.name, netns.link
    client.wait(5)  # killed by close: it ran inside
    assert name not in _ip_lists("netns", "list")
    assert link not in _ip_lists("link", "show")


ATTACHED_RESTART = """
import sys
from pathlib import Path
from consensus_testkit.control import attach_server
server = attach_server(Path(sys.argv[1]))
server.kill()
server.restart(30)
print(server.pid)
"""


def test_control_file_lets_another_process_restart_and_the_owner_stop(tmp_path: Path) -> None:
    server = start_server("etcd", tmp_path)
    control = tmp_path / "etcd.json"
    try:
        first = server.pid
        server.write_control(control)
        described = json.loads(control.read_text())
        assert (described["name"], described["pid"], described["port"]) == ("etcd", first, server.port)
        assert attach_server(control).pid == first

        out = subprocess.run(
            [sys.executable, "-c", ATTACHED_RESTART, str(control)],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        restarted = int(out.stdout.strip())
        assert restarted != first
        assert json.loads(control.read_text())["pid"] == restarted  # the file names the current server
        assert psutil.pid_exists(restarted)  # it outlived the process that started it
        deadline = time.monotonic() + 5
        while psutil.pid_exists(first) and time.monotonic() < deadline:
            time.sleep(0.05)  # the owner reaps the server it started, killed by the other process
        assert not psutil.pid_exists(first)
        assert probe(server.port)
    finally:
        server.stop()
    assert not psutil.pid_exists(restarted) or psutil.Process(restarted).status() == psutil.STATUS_ZOMBIE
    assert not control.exists()
    assert not server.directory.exists()


def test_attach_rejects_an_unreadable_control_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(ValueError, match="unreadable server control file"):
        attach_server(bad)
    with pytest.raises(ValueError, match="unreadable server control file"):
        attach_server(tmp_path / "missing.json")


PLANTED = """
from consensus_testkit.conformance import prober

_timed = prober.Prober._timed


def planted(self, name, call):
    if name == "keys" and sum(c.name == "keys" for c in self.calls) == 2:
        raise RuntimeError("planted in the prober")
    return _timed(self, name, call)


prober.Prober._timed = planted
"""


def _fault_test(workdir: Path, *plugins: str) -> subprocess.CompletedProcess[str]:
    """Run the conformance fault test ``test_server_side_session_expiry`` (it probes) on SQLite in a
    pytest process of its own, with ``plugins`` (modules in ``workdir``) loaded."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(workdir), os.environ.get("PYTHONPATH")])),
    }
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "consensus_testkit.conformance.plugin",
        "-p",
        "no:cacheprovider",
        "--rootdir",
        str(workdir),
        f"--consensus-url=sqlite:///{workdir / 'ct.db'}",
        "--tb=short",
        "-q",
    ]
    for plugin in plugins:
        command += ["-p", plugin]
    command += ["--pyargs", "consensus_testkit.conformance.test_faults::test_server_side_session_expiry"]
    return subprocess.run(
        command, check=False, env=env, capture_output=True, text=True, timeout=300, cwd=workdir
    )


def test_an_exception_in_a_prober_fails_its_fault_test(tmp_path: Path) -> None:
    """A RuntimeError planted in a prober's third ``keys`` call fails the conformance fault test that
    probes (a failure, not a warning) with the traceback; without the plant the same test passes."""
    (tmp_path / "ct_planted.py").write_text(PLANTED)
    planted = _fault_test(tmp_path, "ct_planted")
    assert planted.returncode == 1, planted.stdout + planted.stderr
    assert "1 failed" in planted.stdout, planted.stdout
    assert "the prober thread died" in planted.stdout, planted.stdout
    assert "RuntimeError: planted in the prober" in planted.stdout, planted.stdout
    control = _fault_test(tmp_path)
    assert control.returncode == 0, control.stdout + control.stderr
    assert "1 passed" in control.stdout, control.stdout


PLAIN = "secured_server"


@pytest.mark.parametrize(
    ("url", "server", "declared"),
    [
        (
            "sqlite:///x.db",
            None,
            {"requires_server", "secured_server", "freezes_a_writer", "cluster", "session_roles"},
        ),
        # a URL without tls_ca names a plain server: the security section does not apply there
        (
            "postgresql://u@127.0.0.1:5432/db",
            "postgresql",
            {"database_file", "cluster", "session_roles", PLAIN},
        ),
        ("mariadb://u:pw@127.0.0.1:3306/db", "mariadb", {"database_file", "cluster", "session_roles", PLAIN}),
        ("zk://127.0.0.1:2181/ct", "zookeeper", {"database_file", "cluster", "session_roles", PLAIN}),
        ("zk://127.0.0.1:2181,127.0.0.1:2182/ct", "zookeeper", {"database_file", "session_roles", PLAIN}),
        ("etcd://127.0.0.1:2379/ct", "etcd", {"database_file", "cluster", "session_roles", PLAIN}),
        (
            "etcd://u:pw@127.0.0.1:2379/ct?tls_ca=/certs/ca.pem",
            "etcd",
            {"database_file", "cluster", "session_roles"},
        ),
        ("kafka://127.0.0.1:9092/ct", "kafka", {"database_file", "cluster", "lists_sessions", PLAIN}),
        ("kafka://127.0.0.1:9092,127.0.0.1:9093/ct", "kafka", {"database_file", "lists_sessions", PLAIN}),
    ],
)
def test_every_builtin_backend_declares_its_profile(
    url: str, server: str | None, declared: set[str], tmp_path: Path
) -> None:
    """Each built-in backend's profile names its launcher, a positive detection delay, a server-side
    expirer, and exactly the markers that do not apply, with reasons; its unreachable URL keeps the
    scheme and moves away from where the URL points."""
    profile = profile_for(url)
    assert (profile.server, set(profile.not_applicable)) == (server, declared)
    assert all(profile.not_applicable.values())
    assert profile.detection_delay(3.0) > 0 and profile.expire_session is not None
    parsed = parse_url(url)[0]
    moved = profile.unreachable_url(parsed, tmp_path)
    assert moved.scheme == parsed.scheme and moved != parsed


def test_unreachable_sqlite_database_cannot_be_created(tmp_path: Path) -> None:
    """SQLite's unreachable URL puts the database below a regular file."""
    parsed = parse_url(f"sqlite:///{tmp_path / 'ct.db'}")[0]
    moved = profile_for(parsed).unreachable_url(parsed, tmp_path)
    assert Path(moved.path[1:]).parent.parent.is_file()


def test_a_profile_that_does_not_add_up_is_refused() -> None:
    """Unknown markers, a server no launcher starts, no server or no expirer without the matching
    not-applicable declaration: ConfigurationError when the profile is built."""
    good = {"name": "mine", "detection_delay": lambda timeout: 1.0, "unreachable_url": moved_to_free_port}
    bad: Mapping[str, object]
    for bad in (
        {"server": "postgresql", "expire_session": None, "not_applicable": {}},
        {"server": None, "expire_session": lambda u, i, t: None, "not_applicable": {}},
        {"server": "mystore", "expire_session": lambda u, i, t: None, "not_applicable": {}},
        {"server": "etcd", "expire_session": lambda u, i, t: None, "not_applicable": {"no_such": "x"}},
    ):
        with pytest.raises(ConfigurationError):
            TestProfile(**good, **bad)  # type: ignore[arg-type]
    TestProfile(**good, server=None, expire_session=None,  # type: ignore[arg-type]
                not_applicable={"requires_server": "none", "session_expiry": "none"})  # fmt: skip


def test_a_backend_without_a_profile_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """A scheme whose backend registers no test profile (entry-point group consensus_testkit.profiles)
    gets a ConfigurationError naming the known schemes, never a default."""
    monkeypatch.setattr(registry, "_registered", {})
    registry.register("noprofile", "consensus_api.backend:Backend")
    with pytest.raises(
        ConfigurationError, match=r"no test profile for the URL scheme 'noprofile'; known schemes: .*etcd"
    ):
        profile_for("noprofile://127.0.0.1:1/ct")
