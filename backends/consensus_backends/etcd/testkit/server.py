"""etcd test server: a single-member cluster of etcd ``ETCD_VERSION``, which ``consensus servers install
etcd`` builds into the cache dir (``$CONSENSUS_ETCD_BINARY`` names another binary).

Fast heartbeat/election settings make the lone member leader in ~0.1 s.
``--unsafe-no-fsync`` is on: data survives a process kill, not a machine crash.
The secure variant (``start(secure=True)``) serves clients over TLS with client
certificates required (``--client-cert-auth``; certificates made at start, in
``<dir>/certs``) and RBAC on: its URL names the user ``consensus``, whose role
reads and writes the prefix ``/consensus/`` only. A plain listener on another
port serves the readiness probe and the launcher's setup (through the JSON
gateway, so no password is on a command line).
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import tempfile
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import psutil

from consensus_testkit.certificates import write_certificates
from consensus_testkit.cluster import FOLLOWER, LEADER, NodeStatus
from consensus_testkit.host import HOST, cache_dir, free_port
from consensus_testkit.process import ServerHandle, launch

START_TIMEOUT = 30.0
#: The etcd release the suite runs, which ``consensus servers install etcd`` builds.
ETCD_VERSION = "3.6.16"
#: Names an etcd binary to run instead of the one ``consensus servers install etcd`` builds.
BINARY_VARIABLE = "CONSENSUS_ETCD_BINARY"


def binary(tool: str = "etcd") -> str:
    """The path of ``etcd`` (or ``etcdctl``, its sibling): ``$CONSENSUS_ETCD_BINARY`` when set, else
    ``<cache>/etcd-<ETCD_VERSION>/``; RuntimeError naming what installs it when it is missing."""
    chosen = os.environ.get(BINARY_VARIABLE)
    server = Path(chosen) if chosen else cache_dir() / f"etcd-{ETCD_VERSION}" / "etcd"
    path = server if tool == "etcd" else server.with_name(tool)
    if not (path.is_file() and os.access(path, os.X_OK)):
        origin = f"${BINARY_VARIABLE}" if chosen else f"etcd {ETCD_VERSION}"
        raise RuntimeError(f"{tool} not found at {path} ({origin}): run `consensus servers install etcd`")
    return str(path)


#: The secure variant's user, and the key prefix its role may read and write.
SECURE_USER = "consensus"
SECURE_PREFIX = "/consensus/"


def probe(port: int) -> bool:
    """Whether the member at ``port`` is ready: its ``/health`` reports a leader and a linearizable read
    through it (which etcd makes as root: auth on or off). Not a read through the JSON gateway: with a TLS
    and a plain listener, etcd picks at random the one its gateway dials, and over TLS the gateway's
    requests carry the server certificate's CN as their user name, which auth refuses."""
    try:
        with urllib.request.urlopen(f"http://{HOST}:{port}/health", timeout=1) as response:
            answer = json.loads(response.read())
    except (urllib.error.URLError, OSError, ValueError):
        return False
    return isinstance(answer, dict) and answer.get("health") == "true"


def status(port: int) -> NodeStatus | None:
    """The role of the member whose clients use ``port`` (leader; follower while it knows a leader;
    else ``candidate``) and its raft term; None when it does not answer within 0.5 s.

    The Maintenance Status call's term is that of the member's last *applied* entry, which lags
    behind a new leader's term until it applies its first entry: a leader is reported only after a
    linearizable read through it succeeded (which needs that entry applied) and a second status
    still names it, with the term of that second status."""
    first = _status(port)
    if first is None or first[0] != LEADER:
        return None if first is None else NodeStatus(*first)
    if not probe(port):
        return NodeStatus("candidate", None)
    second = _status(port)
    return None if second is None else NodeStatus(*second)


def _status(port: int) -> tuple[str, int] | None:
    """(role, applied term) from the Maintenance Status call, or None."""
    request = urllib.request.Request(
        f"http://{HOST}:{port}/v3/maintenance/status",
        data=b"{}",
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=0.5) as response:
            answer = json.loads(response.read())
        member, leader = int(answer["header"]["member_id"]), int(answer.get("leader") or 0)
        term = int(answer["raftTerm"])
    except (urllib.error.URLError, OSError, ValueError, KeyError, TypeError):
        return None
    return (LEADER if leader == member else FOLLOWER if leader else "candidate"), term


def serves_session(port: int, identity: Mapping[str, Any]) -> bool:
    """Whether the member at ``port`` holds the client connection of the session ``identity`` names
    (the backend's ``fault_identity``: the endpoint its calls use and its process): that endpoint is
    ``port`` and the kernel shows the process connected to it."""
    endpoint, pid = identity.get("endpoint"), identity.get("pid")
    if not isinstance(endpoint, str) or not isinstance(pid, int) or endpoint.rpartition(":")[2] != str(port):
        return False
    try:
        connections = psutil.Process(pid).net_connections("tcp")
    except psutil.Error:
        return False
    return any(c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED for c in connections)


def _gateway(port: int, path: str, body: dict[str, object]) -> None:
    """POST ``body`` to the JSON gateway's ``/v3/<path>``; RuntimeError with etcd's answer on failure."""
    request = urllib.request.Request(
        f"http://{HOST}:{port}/v3/{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()
    except urllib.error.HTTPError as failed:
        raise RuntimeError(f"etcd setup {path} failed: {failed.read()[:300]!r}") from None


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _enable_auth(port: int, password: str) -> None:
    """A root user with a random password, ``SECURE_USER`` confined to ``SECURE_PREFIX``, auth on."""
    prefix_end = SECURE_PREFIX[:-1] + chr(ord(SECURE_PREFIX[-1]) + 1)
    steps: list[tuple[str, dict[str, object]]] = [
        ("auth/role/add", {"name": "root"}),
        ("auth/user/add", {"name": "root", "password": secrets.token_urlsafe(16)}),
        ("auth/user/grant", {"user": "root", "role": "root"}),
        ("auth/role/add", {"name": SECURE_USER}),
        (
            "auth/role/grant",
            {
                "name": SECURE_USER,
                "perm": {"permType": "READWRITE", "key": _b64(SECURE_PREFIX), "range_end": _b64(prefix_end)},
            },
        ),
        ("auth/user/add", {"name": SECURE_USER, "password": password}),
        ("auth/user/grant", {"user": SECURE_USER, "role": SECURE_USER}),
        ("auth/enable", {}),
    ]
    for path, body in steps:
        _gateway(port, path, body)


def member_command(data_dir: Path, client_url: str, peer_url: str) -> list[str]:
    """The command line of a lone member serving clients at ``client_url``: fast elections, no fsync."""
    return [
        binary(),
        "--name",
        "t",
        "--data-dir",
        str(data_dir),
        "--listen-client-urls",
        client_url,
        "--advertise-client-urls",
        client_url,
        "--listen-peer-urls",
        peer_url,
        "--initial-advertise-peer-urls",
        peer_url,
        "--initial-cluster",
        f"t={peer_url}",
        "--initial-cluster-state",
        "new",
        "--initial-cluster-token",
        "t",
        "--heartbeat-interval",
        "10",
        "--election-timeout",
        "100",
        "--unsafe-no-fsync",
    ]


def start(workdir: Path | None = None, *, secure: bool = False) -> ServerHandle:
    """Start a fresh single-member etcd on free loopback ports and wait until it serves reads."""
    binary()  # a missing binary fails before anything is created
    directory = Path(tempfile.mkdtemp(prefix="etcd-", dir=workdir))
    client, peer = free_port(), free_port()
    if not secure:
        command = member_command(directory / "data", f"http://{HOST}:{client}", f"http://{HOST}:{peer}")
        handle = ServerHandle(
            "etcd", f"etcd://{HOST}:{client}", client, directory, command=command, probe=lambda: probe(client)
        )
        return launch(handle, START_TIMEOUT)
    certs = write_certificates(directory / "certs")
    plain = free_port()
    (directory / "probe-port").write_text(str(plain))  # testing.PROBE_PORT_FILE
    command = member_command(
        directory / "data", f"https://{HOST}:{client},http://{HOST}:{plain}", f"http://{HOST}:{peer}"
    )
    command += [
        "--advertise-client-urls",
        f"https://{HOST}:{client}",
        "--cert-file",
        str(certs / "server.pem"),
        "--key-file",
        str(certs / "server.key"),
        "--trusted-ca-file",
        str(certs / "ca.pem"),
        "--client-cert-auth",
    ]
    password = secrets.token_urlsafe(16)
    query = urlencode(
        {"tls_ca": certs / "ca.pem", "tls_cert": certs / "client.pem", "tls_key": certs / "client.key"}
    )
    url = f"etcd://{SECURE_USER}:{password}@{HOST}:{client}{SECURE_PREFIX.rstrip('/')}?{query}"
    handle = ServerHandle("etcd", url, client, directory, command=command, probe=lambda: probe(plain))
    return launch(handle, START_TIMEOUT, then=lambda: _enable_auth(plain, password))
