"""The etcd backend connecting to real etcd servers: unreachable endpoints, option checks, URL
checks, authentication with a user and password, and TLS with client certificates."""

from __future__ import annotations

import logging
import socket
import subprocess
import time
import uuid
from pathlib import Path

import pytest

import consensus_api as ca
from consensus_backends.etcd.testkit.server import binary as etcd_binary
from consensus_backends.etcd.testkit.server import member_command
from consensus_testkit import ServerHandle, start_server
from consensus_testkit.certificates import write_certificates
from consensus_testkit.conformance.helpers import EventLog
from consensus_testkit.host import HOST, free_port
from consensus_testkit.process import launch

#: Over connect_timeout, for giving up on an unreachable server on a loaded 2-core machine (channel
#: teardown included); the latency itself is measured by benchmarks/detection.py.
UNREACHABLE_SLACK = 3.0


def test_unreachable_cluster_is_backend_unavailable() -> None:
    started = time.monotonic()
    with pytest.raises(ca.BackendUnavailableError, match="connect_timeout"):
        ca.connect(f"etcd://{HOST}:{free_port()}/x", connect_timeout=1)
    assert time.monotonic() - started < 1 + UNREACHABLE_SLACK


def test_partial_tls_options_are_configuration_errors(etcd_server: ServerHandle, tmp_path: Path) -> None:
    for name in ("c.pem", "ca.pem"):
        (tmp_path / name).write_text("-")
    with pytest.raises(ca.ConfigurationError, match="no such file"):
        ca.connect(etcd_server.url + "/x", tls_cert=str(tmp_path / "missing.pem"))
    with pytest.raises(ca.ConfigurationError, match="together"):
        ca.connect(etcd_server.url + "/x", tls_cert=str(tmp_path / "c.pem"))
    with pytest.raises(ca.ConfigurationError, match="need tls=true"):
        ca.connect(etcd_server.url + "/x", tls=False, tls_ca=str(tmp_path / "ca.pem"))


def _etcdctl(port: int, *args: str) -> None:
    command = [etcd_binary("etcdctl"), f"--endpoints={HOST}:{port}", *args]
    subprocess.run(command, check=True, capture_output=True, timeout=30)


def test_authentication_with_user_and_password_from_the_url(caplog: pytest.LogCaptureFixture) -> None:
    password = "s3cret-" + uuid.uuid4().hex[:8]
    with start_server("etcd") as auth_server:
        for command in (
            ["user", "add", "root", "--new-user-password=rootpw"],
            ["user", "grant-role", "root", "root"],
            ["user", "add", "app", f"--new-user-password={password}"],
            ["role", "add", "app"],
            ["role", "grant-permission", "app", "--prefix=true", "readwrite", "/app/"],
            ["user", "grant-role", "app", "app"],
            ["auth", "enable"],
        ):
            _etcdctl(auth_server.port, *command)
        host = f"{HOST}:{auth_server.port}"
        caplog.set_level(logging.DEBUG)
        with ca.connect(f"etcd://app:{password}@{host}/app") as session:
            values: EventLog[ca.ValueChanged] = EventLog("values")
            session.listeners.add_value_listener("k", values)
            version = session.storage.put("k", b"v")
            values.wait_last(lambda event: event.version == version)
            session.group("g").join("m")
            assert session.election("s").nominate("c")
            assert password not in repr(session)
        for url in (f"etcd://app:wrong@{host}/app", f"etcd://{host}/app"):
            with pytest.raises(ca.ConfigurationError) as refused:
                ca.connect(url)
            assert "wrong" not in str(refused.value)
        with pytest.raises(ca.ConfigurationError, match="permission denied"):
            ca.connect(f"etcd://app:{password}@{host}/elsewhere")
        assert password not in caplog.text


def test_tls_with_client_certificates(tmp_path: Path) -> None:
    write_certificates(tmp_path)
    client, peer = free_port(), free_port()
    command = [
        *member_command(tmp_path / "server" / "data", f"https://{HOST}:{client}", f"http://{HOST}:{peer}"),
        "--cert-file",
        str(tmp_path / "server.pem"),
        "--key-file",
        str(tmp_path / "server.key"),
        "--trusted-ca-file",
        str(tmp_path / "ca.pem"),
        "--client-cert-auth",
    ]

    def probe() -> bool:
        with socket.socket() as sock:
            return sock.connect_ex((HOST, client)) == 0

    files = {"tls_ca": "ca.pem", "tls_cert": "client.pem", "tls_key": "client.key"}
    options = {name: str(tmp_path / file) for name, file in files.items()}
    server_dir = tmp_path / "server"
    server_dir.mkdir()
    with launch(
        ServerHandle("etcd-tls", f"etcd://{HOST}:{client}", client, server_dir, command=command, probe=probe),
        30,
    ):
        with ca.connect(f"etcd://{HOST}:{client}/tls", connect_timeout=10, **options) as session:
            assert session.storage.put("k", b"v") > 0
            assert session.election("s").nominate("c")
        # etcd 3.6 refuses a client certificate after the TLS 1.3 handshake: still refused at once
        impostor = {"tls_cert": str(tmp_path / "impostor.pem"), "tls_key": str(tmp_path / "impostor.key")}
        for refused in ({}, impostor):  # no client certificate; one not signed by the server's CA
            started = time.monotonic()
            with pytest.raises(ca.ConfigurationError, match="certificate was refused"):
                ca.connect(
                    f"etcd://{HOST}:{client}/tls", connect_timeout=10, tls_ca=options["tls_ca"], **refused
                )
            assert time.monotonic() - started < 2


@pytest.mark.parametrize("url", ["etcd:///x", "etcd://", "etcd://[::1:2379/x"])
def test_url_without_a_host_or_with_a_malformed_one_is_refused(url: str) -> None:
    """No host, or an IPv6 host without its closing bracket: ConfigurationError before any I/O."""
    with pytest.raises(ca.ConfigurationError, match="host"):
        ca.connect(url, connect_timeout=1)
