"""MariaDB test server: a throwaway server from Debian's ``mariadb-server`` binaries.

As root the server runs as the ``mysql`` user (mariadbd refuses root);
otherwise as the current user. Its data dir is made by ``mariadb-install-db``;
at every start an init file (mode 0600, in the server's dir, never on a
command line) creates the database ``consensus`` and the user ``consensus``
with a random password, which only the URL carries (``redacted()`` hides
it). No grant tables are skipped. Commits survive a kill -9 (each is written
to the OS at commit: ``innodb_flush_log_at_trx_commit=2``), not a machine
crash.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import signal
import socket
import tempfile
from pathlib import Path

from consensus_backends.sql.testkit.postgresql import _as_owner, _make_reachable
from consensus_testkit.host import HOST, free_port, run_checked
from consensus_testkit.process import ServerHandle, launch

START_TIMEOUT = 60.0
DATABASE = USER = "consensus"
#: The first byte of the server's greeting: protocol version 10 (an error packet starts with 0xff).
PROTOCOL_VERSION = 10


def _binary(name: str) -> str:
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin")
    if found is None:
        raise RuntimeError(f"MariaDB is not installed ({name} not found): run scripts/install.sh")
    return found


def _owner() -> pwd.struct_passwd:
    """The account the server runs as."""
    return pwd.getpwnam("mysql") if os.geteuid() == 0 else pwd.getpwuid(os.geteuid())


def probe(port: int) -> bool:
    """True once the server sends its greeting on ``port`` (it listens only when ready to serve)."""
    try:
        with socket.create_connection((HOST, port), timeout=2) as sock:
            header = sock.recv(5)
    except OSError:
        return False
    return len(header) == 5 and header[4] == PROTOCOL_VERSION


def _write_init_file(path: Path, password: str, uid: int, gid: int) -> None:
    """The SQL the server runs at every start: the database and its user (idempotent)."""
    quoted = password.replace("\\", "\\\\").replace("'", "\\'")
    sql = (
        f"CREATE DATABASE IF NOT EXISTS {DATABASE};\n"
        f"CREATE USER IF NOT EXISTS '{USER}'@'{HOST}' IDENTIFIED BY '{quoted}';\n"
        f"GRANT ALL PRIVILEGES ON {DATABASE}.* TO '{USER}'@'{HOST}';\n"
    )
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as file:
        file.write(sql)
    os.chown(path, uid, gid)


def start(workdir: Path | None = None, *, secure: bool = False) -> ServerHandle:
    """Start a fresh MariaDB on a free loopback port and wait until it greets clients.

    As root, ancestors of the server dir that deny others traversal get o+x so ``mysql`` can reach it.
    """
    server_binary = _binary("mariadbd")
    owner = _owner()
    directory = Path(tempfile.mkdtemp(prefix="mariadb-", dir=workdir))
    port = free_port()
    data = directory / "data"
    init_file = directory / "init.sql"
    password = secrets.token_urlsafe(18)
    tuning = [
        "--innodb-flush-log-at-trx-commit=2",
        "--innodb-buffer-pool-size=64M",
        "--innodb-log-file-size=16M",
        "--skip-name-resolve",
        "--skip-log-bin",
    ]
    command = [
        server_binary,
        "--no-defaults",
        f"--datadir={data}",
        f"--port={port}",
        f"--bind-address={HOST}",
        f"--socket={directory / 'mariadbd.sock'}",
        f"--pid-file={directory / 'mariadbd.pid'}",
        f"--init-file={init_file}",
        "--max-connections=500",
        *tuning,
    ]
    handle = ServerHandle(
        "mariadb",
        f"mariadb://{USER}:{password}@{HOST}:{port}/{DATABASE}",
        port,
        directory,
        command=command,
        probe=lambda: probe(port),
        stop_signal=signal.SIGTERM,
        popen_kwargs=_as_owner(owner),
    )
    try:
        _make_reachable(directory, owner)
        _write_init_file(init_file, password, owner.pw_uid, owner.pw_gid)
        run_checked(
            [
                _binary("mariadb-install-db"),
                "--no-defaults",
                f"--datadir={data}",
                "--skip-test-db",
                "--auth-root-authentication-method=socket",
                *tuning,
            ],
            handle.log_path,
            "mariadb-install-db",
            **_as_owner(owner),
        )
    except BaseException:
        handle.stop()
        raise
    return launch(handle, START_TIMEOUT)
