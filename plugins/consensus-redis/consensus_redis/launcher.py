"""The ``redis`` test server (``consensus servers run redis``), found through the entry-point group
``consensus_api.launchers``: Debian's ``redis-server`` on a free loopback port, in its own temp dir.

Durable as the backend's docs state: ``appendonly yes`` with ``appendfsync always``
(an acknowledged write is in the append-only file before the reply), no RDB
snapshots. Controlled by PID like the built-in servers
(``consensus_api.testing._process``): kill, pause and restart keep the port and
the data dir. ``scripts/install.sh`` installs ``redis-server``.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from consensus_api.testing._process import HOST, ServerHandle, free_port, launch, tcp_request

START_TIMEOUT = 30.0


def _binary() -> str:
    found = shutil.which("redis-server") or (
        "/usr/bin/redis-server" if Path("/usr/bin/redis-server").is_file() else None
    )
    if found is None:
        raise RuntimeError("redis-server not found: run scripts/install.sh (Debian package redis-server)")
    return found


def probe(port: int) -> bool:
    """``PING`` answers ``+PONG`` only once the data set is loaded (``-LOADING`` before)."""
    return tcp_request(port, b"PING\r\nQUIT\r\n").startswith(b"+PONG")


def start(workdir: Path | None = None, *, secure: bool = False) -> ServerHandle:
    """Start a fresh ``redis-server`` on a free loopback port and wait until it answers ``PING``."""
    if secure:
        raise ValueError("no secure variant of redis yet")
    binary = _binary()
    directory = Path(tempfile.mkdtemp(prefix="redis-", dir=workdir))
    port = free_port()
    config = directory / "redis.conf"
    config.write_text(
        f"bind {HOST}\n"
        f"port {port}\n"
        f"dir {directory}\n"
        "daemonize no\n"
        "protected-mode yes\n"
        "appendonly yes\n"
        "appendfsync always\n"
        'save ""\n'
        "maxclients 2000\n"
        "loglevel notice\n"
        'logfile ""\n'
    )
    handle = ServerHandle(
        "redis",
        f"redis://{HOST}:{port}/",
        port,
        directory,
        command=[binary, str(config)],
        probe=lambda: probe(port),
    )
    launch(handle, START_TIMEOUT)
    return handle
