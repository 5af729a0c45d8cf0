"""The fault tools of consensus_api.testing: the TCP proxy and server control files (no mocks)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from consensus_api.testing import ServerHandle, start_server
from consensus_api.testing._process import HOST
from consensus_api.testing.etcd import probe
from consensus_api.testing.proxy import TcpProxy


@pytest.fixture
def echo_port() -> Iterator[int]:
    """A loopback echo server: every connection gets back what it sends."""
    listener = socket.create_server((HOST, 0))
    listener.settimeout(0.1)
    done = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn:
            while data := conn.recv(4096):
                conn.sendall(data)

    def accept() -> None:
        while not done.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    done.set()
    thread.join(2)
    listener.close()


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


ATTACHED_RESTART = """
import sys
from pathlib import Path
from consensus_api.testing import ServerHandle
server = ServerHandle.attach(Path(sys.argv[1]))
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
        assert ServerHandle.attach(control).pid == first

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
        ServerHandle.attach(bad)
    with pytest.raises(ValueError, match="unreadable server control file"):
        ServerHandle.attach(tmp_path / "missing.json")
