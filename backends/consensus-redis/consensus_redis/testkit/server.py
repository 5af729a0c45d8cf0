"""The ``redis`` test server (``consensus servers run redis``), registered by
``consensus_redis.testkit.launcher`` in the entry-point group ``consensus_testkit.launchers``:
Debian's ``redis-server`` on a free loopback port, in its own temp dir.

Durable as the backend's docs state: ``appendonly yes`` with ``appendfsync always``
(an acknowledged write is in the append-only file before the reply), no RDB
snapshots. Controlled by PID like the built-in servers
(``consensus_testkit.process``): kill, pause and restart keep the port and
the data dir. ``consensus servers install redis`` installs ``redis-server``.

The secure variant (``start(secure=True)``) serves clients only on a TLS port
(client certificates required; certificates made at start in ``<dir>/certs``,
``consensus_testkit.certificates``) and its URL names the ACL user
``consensus``, who may use keys under the prefix ``/consensus`` only (no
``@dangerous`` command but ``INFO``); the config file holds the SHA-256 of the
password, not the password. The default user needs a password nobody is
given (it must keep every permission: Redis 7.0 replays scripts' effects from
the append-only file as that user); a plain port is kept for the readiness
probe.
"""

from __future__ import annotations

import hashlib
import secrets
import shutil
import tempfile
from pathlib import Path
from urllib.parse import urlencode

from consensus_testkit.certificates import write_certificates
from consensus_testkit.host import HOST, free_port, tcp_request
from consensus_testkit.process import ServerHandle, launch

START_TIMEOUT = 30.0
#: The secure variant's user and the prefix (URL path) its keys must start with.
SECURE_USER = "consensus"
SECURE_PREFIX = "/consensus"


def _binary() -> str:
    found = shutil.which("redis-server") or (
        "/usr/bin/redis-server" if Path("/usr/bin/redis-server").is_file() else None
    )
    if found is None:
        raise RuntimeError(
            "redis-server not found: run `consensus servers install redis` (Debian package redis-server)"
        )
    return found


def probe(port: int) -> bool:
    """``PING`` answers ``+PONG`` only once the data set is loaded (``-LOADING`` before); the secure
    variant answers ``-NOAUTH`` (even while loading: clients retry ``LOADING`` replies)."""
    return tcp_request(port, b"PING\r\nQUIT\r\n").startswith((b"+PONG", b"-NOAUTH"))


def _tls_config(directory: Path, tls_port: int) -> tuple[str, str]:
    """The secure variant's config lines and its URL's user, password, path and TLS options."""
    certs = write_certificates(directory / "certs")
    password = secrets.token_urlsafe(16)
    digest = hashlib.sha256(password.encode()).hexdigest()
    config = (
        f"tls-port {tls_port}\n"
        f"tls-cert-file {certs / 'server.pem'}\ntls-key-file {certs / 'server.key'}\n"
        f"tls-ca-cert-file {certs / 'ca.pem'}\ntls-auth-clients yes\n"
        # Redis 7.0 checks the MULTI/EXEC that replays a script's effects from the append-only file
        # against the default user's rules: restricting that user drops those writes at a restart.
        # So the default user keeps every permission, behind a password nobody is given.
        f"user default on #{hashlib.sha256(secrets.token_bytes(32)).hexdigest()} ~* &* +@all\n"
        f"user {SECURE_USER} on #{digest} resetkeys ~{SECURE_PREFIX}* resetchannels +@all -@dangerous +info\n"
    )
    query = urlencode(
        {"tls_ca": certs / "ca.pem", "tls_cert": certs / "client.pem", "tls_key": certs / "client.key"}
    )
    return config, f"redis://{SECURE_USER}:{password}@{HOST}:{tls_port}{SECURE_PREFIX}?{query}"


def start(workdir: Path | None = None, *, secure: bool = False) -> ServerHandle:
    """Start a fresh ``redis-server`` on a free loopback port and wait until it answers ``PING``."""
    binary = _binary()
    directory = Path(tempfile.mkdtemp(prefix="redis-", dir=workdir))
    port = free_port()
    client_port, url, tls = port, f"redis://{HOST}:{port}/", ""
    if secure:
        client_port = free_port()
        tls, url = _tls_config(directory, client_port)
        (directory / "probe-port").write_text(str(port))  # testing.PROBE_PORT_FILE
    config = directory / "redis.conf"
    config.write_text(
        tls + f"bind {HOST}\n"
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
        "redis", url, client_port, directory, command=[binary, str(config)], probe=lambda: probe(port)
    )
    launch(handle, START_TIMEOUT)
    return handle
