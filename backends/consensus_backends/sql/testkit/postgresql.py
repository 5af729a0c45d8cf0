"""PostgreSQL test server: a throwaway cluster from Debian's binaries.

As root the cluster runs as the ``postgres`` user (PostgreSQL refuses root);
otherwise as the current user. The superuser is always ``postgres`` with trust
auth, except in the secure variant (``start(secure=True)``): TLS only
(``hostssl``, certificates made at start in ``<dir>/certs``), ``scram-sha-256``
passwords for every user, no trust; its URL names the user ``consensus``, which
owns the database ``consensus`` and may not connect to ``elsewhere``, with a random password
(``postgres`` gets one too, kept in ``<dir>/superuser-password``). The data
dir is copied from a template made by ``initdb`` once per major version and
owner, kept in the cache dir. Commits survive a kill -9
(fsync is off, synchronous_commit is on), not a machine crash.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import signal
import stat
import subprocess
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import quote

from consensus_testkit.certificates import write_certificates
from consensus_testkit.host import HOST, cache_dir, free_port, run_checked
from consensus_testkit.process import ServerHandle, launch

START_TIMEOUT = 30.0


def _bindir() -> Path:
    """The newest ``/usr/lib/postgresql/<major>/bin``, else the dir of ``postgres`` on PATH."""
    found = [
        p.parent for p in Path("/usr/lib/postgresql").glob("*/bin/postgres") if p.parent.parent.name.isdigit()
    ]
    if found:
        return max(found, key=lambda b: int(b.parent.name))
    on_path = shutil.which("postgres")
    if on_path:
        return Path(on_path).resolve().parent
    raise RuntimeError("PostgreSQL is not installed: run `consensus servers install postgresql`")


def _owner() -> pwd.struct_passwd:
    """The account the cluster runs as."""
    return pwd.getpwnam("postgres") if os.geteuid() == 0 else pwd.getpwuid(os.geteuid())


def _as_owner(owner: pwd.struct_passwd) -> dict[str, Any]:
    """Popen arguments that run a command as ``owner`` (none when that is us)."""
    if owner.pw_uid == os.geteuid():
        return {}
    return {"user": owner.pw_uid, "group": owner.pw_gid, "extra_groups": []}


def _make_reachable(directory: Path, owner: pwd.struct_passwd) -> None:
    """Give ``directory`` to ``owner`` and let it traverse every ancestor (adds o+x where missing)."""
    os.chown(directory, owner.pw_uid, owner.pw_gid)
    for parent in directory.parents:
        mode = parent.stat().st_mode
        if not mode & stat.S_IXOTH:
            parent.chmod(stat.S_IMODE(mode) | stat.S_IXOTH)


def _prepare_data(bindir: Path, data: Path, owner: pwd.struct_passwd, log: Path) -> None:
    """Fill ``data`` from the cached template, creating the template with initdb on first use."""
    template = cache_dir() / f"postgresql-{bindir.parent.name}-{owner.pw_name}-template-wal1m"
    if (template / "PG_VERSION").is_file():
        run_checked(["cp", "-a", str(template), str(data)], log, "copying the PostgreSQL template")
        return
    run_checked(
        [
            str(bindir / "initdb"),
            "-D",
            str(data),
            "-A",
            "trust",
            "-U",
            "postgres",
            "-E",
            "UTF8",
            "--locale=C.UTF-8",
            "--no-sync",
            "--wal-segsize=1",
        ],
        log,
        "initdb",
        **_as_owner(owner),
    )
    template.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".pg-template-", dir=template.parent))
    try:
        run_checked(["cp", "-a", str(data), str(staging / "data")], log, "saving the PostgreSQL template")
        os.rename(staging / "data", template)
    except OSError:
        pass  # a concurrent start saved the template first
    finally:
        shutil.rmtree(staging, ignore_errors=True)


#: What a server that accepts connections says to a login without a password it demands.
_ASKS_FOR_PASSWORD = ("no password supplied", "password authentication failed")


def probe(port: int) -> bool:
    """``select 1`` answers as ``postgres`` without a password, or the server asks for one (secure variant:
    it only does that once it accepts connections)."""
    import psycopg  # noqa: PLC0415 - the postgresql extra (the mariadb launcher loads this module too)

    try:
        with psycopg.connect(
            host=HOST, port=port, user="postgres", dbname="postgres", connect_timeout=2
        ) as conn:
            conn.execute("select 1")
    except psycopg.OperationalError as exc:
        return any(reply in str(exc) for reply in _ASKS_FOR_PASSWORD)
    return True


#: The secure variant's application user and database.
SECURE_USER = "consensus"


def _secure_setup(
    bindir: Path, directory: Path, owner: pwd.struct_passwd, log: Path
) -> tuple[list[str], str]:
    """Certificates, pg_hba.conf and passwords for the secure variant (single-user mode, passwords on
    stdin); the server's extra arguments and the application user's password."""
    certs = write_certificates(directory / "certs")
    for path in (certs, *certs.iterdir()):
        os.chown(path, owner.pw_uid, owner.pw_gid)
    hba = directory / "pg_hba.conf"
    hba.write_text("hostssl all all 127.0.0.1/32 scram-sha-256\n")
    os.chown(hba, owner.pw_uid, owner.pw_gid)
    superuser, application = secrets.token_urlsafe(16), secrets.token_urlsafe(16)
    (directory / "superuser-password").write_text(superuser)
    script = (
        f"ALTER ROLE postgres PASSWORD '{superuser}'\n"
        f"CREATE ROLE {SECURE_USER} LOGIN PASSWORD '{application}'\n"
        f"CREATE DATABASE {SECURE_USER} OWNER {SECURE_USER}\n"
        "CREATE DATABASE elsewhere\n"
        "REVOKE CONNECT ON DATABASE elsewhere FROM PUBLIC\n"
    )
    with log.open("ab") as out:
        done = subprocess.run(
            [str(bindir / "postgres"), "--single", "-D", str(directory / "data"), "postgres"],
            input=script.encode(),
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=60,
            check=False,
            **_as_owner(owner),
        )
    if done.returncode != 0:
        raise RuntimeError(f"setting the PostgreSQL passwords failed with exit code {done.returncode}")
    arguments = [
        "-c",
        "ssl=on",
        "-c",
        f"ssl_cert_file={certs / 'server.pem'}",
        "-c",
        f"ssl_key_file={certs / 'server.key'}",
        "-c",
        f"hba_file={hba}",
        "-c",
        "log_connections=on",
    ]
    return arguments, application


def start(workdir: Path | None = None, *, secure: bool = False) -> ServerHandle:
    """Start a fresh PostgreSQL on a free loopback port and wait until it answers ``select 1``.

    As root, ancestors of the server dir that deny others traversal get o+x so ``postgres`` can reach it.
    """
    bindir = _bindir()
    owner = _owner()
    directory = Path(tempfile.mkdtemp(prefix="postgresql-", dir=workdir))
    port = free_port()
    data = directory / "data"
    command = [
        str(bindir / "postgres"),
        "-D",
        str(data),
        "-p",
        str(port),
        "-k",
        str(directory),
        "-c",
        f"listen_addresses={HOST}",
        "-c",
        "max_connections=200",
        # fsync=off keeps commits cheap but durable across a kill -9 (the OS holds the WAL);
        # synchronous_commit=off would lose recent commits still in shared WAL buffers.
        "-c",
        "fsync=off",
        "-c",
        "full_page_writes=off",
    ]
    url = f"postgresql+psycopg://postgres@{HOST}:{port}/postgres"
    log = directory / "server.log"
    try:
        _make_reachable(directory, owner)
        _prepare_data(bindir, data, owner, log)
        if secure:
            arguments, password = _secure_setup(bindir, directory, owner, log)
            command.extend(arguments)
            url = (
                f"postgresql+psycopg://{SECURE_USER}:{quote(password, safe='')}@{HOST}:{port}/{SECURE_USER}"
                f"?tls_ca={quote(str(directory / 'certs' / 'ca.pem'))}"
            )
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    handle = ServerHandle(
        "postgresql",
        url,
        port,
        directory,
        command=command,
        probe=lambda: probe(port),
        stop_signal=signal.SIGINT,
        popen_kwargs=_as_owner(owner),
    )
    return launch(handle, START_TIMEOUT)
