"""MariaDB test server: a throwaway server from Debian's ``mariadb-server`` binaries.

As root the server runs as the ``mysql`` user (mariadbd refuses root);
otherwise as the current user. Its data dir is made by ``mariadb-install-db``;
at every start an init file (mode 0600, in the server's dir, never on a
command line) creates the database ``consensus`` and the user ``consensus``
with a random password, which only the URL carries (``redacted()`` hides
it). No grant tables are skipped. Commits survive a kill -9 (each is written
to the OS at commit: ``innodb_flush_log_at_trx_commit=2``), not a machine
crash.

The secure variant (``start(secure=True)``) admits TLS connections only
(``require_secure_transport``), with certificates made at start in
``<dir>/certs`` (``consensus_testkit.certificates``); the user ``consensus``
must present the client certificate as well as its password (``REQUIRE
X509``), and may not use the database ``elsewhere``. Its URL names the user,
the password, ``tls_ca``, ``tls_cert`` and ``tls_key``.
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
from urllib.parse import quote, urlencode

from consensus_backends.sql.testkit.postgresql import _as_owner, _make_reachable
from consensus_testkit.certificates import write_certificates
from consensus_testkit.host import HOST, free_port, run_checked
from consensus_testkit.process import ServerHandle, launch

START_TIMEOUT = 60.0
DATABASE = USER = "consensus"
#: The secure variant's database its user has no privilege on.
FORBIDDEN_DATABASE = "elsewhere"
#: The first byte of the server's greeting: protocol version 10 (an error packet starts with 0xff).
PROTOCOL_VERSION = 10


def _binary(name: str) -> str:
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin")
    if found is None:
        raise RuntimeError(
            f"MariaDB is not installed ({name} not found): run `consensus servers install mariadb`"
        )
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


def _write_init_file(path: Path, password: str, uid: int, gid: int, *, secure: bool) -> None:
    """The SQL the server runs at every start: the database and its user (idempotent); secure: the
    user needs TLS with its client certificate, and a database it may not use exists."""
    quoted = password.replace("\\", "\\\\").replace("'", "\\'")
    requirement = " REQUIRE X509" if secure else ""
    sql = (
        f"CREATE DATABASE IF NOT EXISTS {DATABASE};\n"
        f"CREATE USER IF NOT EXISTS '{USER}'@'{HOST}' IDENTIFIED BY '{quoted}'{requirement};\n"
        f"GRANT ALL PRIVILEGES ON {DATABASE}.* TO '{USER}'@'{HOST}';\n"
    )
    if secure:
        sql += f"CREATE DATABASE IF NOT EXISTS {FORBIDDEN_DATABASE};\n"
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as file:
        file.write(sql)
    os.chown(path, uid, gid)


def _secure_arguments(certs: Path) -> tuple[list[str], dict[str, str]]:
    """The secure variant's server arguments and URL options, for the certificates in ``certs``."""
    arguments = [
        f"--ssl-ca={certs / 'ca.pem'}",
        f"--ssl-cert={certs / 'server.pem'}",
        f"--ssl-key={certs / 'server.key'}",
        "--require-secure-transport=ON",
    ]
    files = {"tls_ca": "ca.pem", "tls_cert": "client.pem", "tls_key": "client.key"}
    return arguments, {option: str(certs / name) for option, name in files.items()}


def _write_certificates(certs: Path, owner: pwd.struct_passwd) -> None:
    """The certificates of ``consensus_testkit.certificates`` in ``certs``, owned by ``owner``."""
    write_certificates(certs)
    for path in (certs, *certs.iterdir()):
        os.chown(path, owner.pw_uid, owner.pw_gid)


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
    url = f"mariadb://{USER}:{quote(password, safe='')}@{HOST}:{port}/{DATABASE}"
    if secure:
        arguments, tls = _secure_arguments(directory / "certs")
        command.extend(arguments)
        url += "?" + urlencode(tls)
    handle = ServerHandle(
        "mariadb",
        url,
        port,
        directory,
        command=command,
        probe=lambda: probe(port),
        stop_signal=signal.SIGTERM,
        popen_kwargs=_as_owner(owner),
    )
    try:
        _make_reachable(directory, owner)
        if secure:
            _write_certificates(directory / "certs", owner)
        _write_init_file(init_file, password, owner.pw_uid, owner.pw_gid, secure=secure)
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
