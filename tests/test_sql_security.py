"""PostgreSQL with TLS and scram-sha-256 passwords (the secure test server): verification, permanent
failures named and not retried, sub-second connect deadlines, table prefixes checked."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qsl

import pytest

import consensus_api as ca
from consensus_backends.sql.client import APPLICATION_NAME
from consensus_testkit import ServerHandle, start_server
from consensus_testkit.certificates import Impostor

#: Slack for a refused connect on a loaded 2-core machine.
REFUSAL_SLACK = 1.0


@pytest.fixture(scope="module")
def secure_postgresql() -> Iterator[ServerHandle]:
    with start_server("postgresql", secure=True) as handle:
        yield handle


def _split(handle: ServerHandle) -> tuple[str, dict[str, str], str]:
    """The URL without its query, its options, and the password in it."""
    base, _, query = handle.url.partition("?")
    password = base.split("@")[0].rsplit(":", 1)[1]
    return base, dict(parse_qsl(query)), password


def _failed_logins(handle: ServerHandle) -> int:
    return handle.log_path.read_text(errors="replace").count("password authentication failed")


def test_tls_and_password_work(secure_postgresql: ServerHandle, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    base, options, password = _split(secure_postgresql)
    with ca.connect(base, **options) as session:
        version = session.storage.put("k", b"v")
        assert session.storage.fetch("k") == ca.Versioned(b"v", version)
        assert password not in repr(session) and password not in repr(session.settings)
    assert not [r for r in caplog.records if password in r.getMessage()]
    assert not [r for r in caplog.records if "without TLS" in r.getMessage()]


def test_wrong_password_is_one_login_attempt(secure_postgresql: ServerHandle) -> None:
    """No retry storm: one attempt per connect, an error saying authentication failed, at once."""
    base, options, _ = _split(secure_postgresql)
    wrong = "wrong-" + "x" * 12
    url = base.replace(base.split("@")[0].rsplit(":", 1)[1], wrong, 1)
    before = _failed_logins(secure_postgresql)
    started = time.monotonic()
    with pytest.raises(ca.ConfigurationError, match="authentication failed") as refused:
        ca.connect(url, **options, connect_timeout=10)
    assert time.monotonic() - started < REFUSAL_SLACK
    assert wrong not in str(refused.value) and wrong not in repr(refused.value)
    deadline = time.monotonic() + 5
    while _failed_logins(secure_postgresql) == before and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)  # any further attempt would have been logged by now
    assert _failed_logins(secure_postgresql) == before + 1


def test_missing_database_and_tls_failures_are_told_apart(secure_postgresql: ServerHandle) -> None:
    base, options, password = _split(secure_postgresql)
    with pytest.raises(ca.ConfigurationError, match="does not exist") as missing:
        ca.connect(base.rsplit("/", 1)[0] + "/no_such_db", **options)
    other_ca = options["tls_ca"].replace("ca.pem", "other-ca.pem")
    with pytest.raises(ca.ConfigurationError, match="TLS: the server's certificate was refused") as untrusted:
        ca.connect(base, **{**options, "tls_ca": other_ca})
    with pytest.raises(ca.ConfigurationError, match="TLS: the server's certificate was refused"):
        ca.connect(base, tls=True)  # the system trust store does not know the test CA
    with pytest.raises(ca.ConfigurationError, match="no encryption"):
        ca.connect(base)  # the server admits no plain connection: no silent TLS-less fallback either
    for raised in (missing, untrusted):
        assert password not in str(raised.value)


@pytest.mark.parametrize(
    ("presented", "cause"),
    [("other-host", "another host name|refused"), ("expired", "expired|refused"), ("impostor", "refused")],
)
def test_a_bad_server_certificate_gets_no_password(
    secure_postgresql: ServerHandle, presented: str, cause: str
) -> None:
    base, options, _ = _split(secure_postgresql)
    certificates = Path(options["tls_ca"]).parent
    with Impostor(certificates, presented) as impostor:
        started = time.monotonic()
        with pytest.raises(ca.ConfigurationError, match=f"TLS: .*({cause})"):
            ca.connect(base.replace(f":{secure_postgresql.port}/", f":{impostor.port}/"), **options)
        assert time.monotonic() - started < REFUSAL_SLACK
    assert impostor.received == 0  # libpq checks the host name after the handshake, before any message


def test_sub_second_timeouts_connect_and_give_up_in_time(secure_postgresql: ServerHandle) -> None:
    """A sub-second connect_timeout can connect (a TLS + SCRAM login on a loaded machine may take
    longer once: one of five tries is enough; before, none could) and gives up in time."""
    base, options, _ = _split(secure_postgresql)
    for attempt in range(5):
        try:
            with ca.connect(base, **options, connect_timeout=0.5, request_timeout=0.5) as session:
                session.storage.put(f"fast-{attempt}", b"v")
            break
        except (ca.BackendUnavailableError, ca.OperationTimeoutError):
            if attempt == 4:
                raise
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts TCP, never answers
        port = silent.getsockname()[1]
        started = time.monotonic()
        with pytest.raises(ca.BackendUnavailableError):
            ca.connect(
                base.replace(f":{secure_postgresql.port}/", f":{port}/"), **options, connect_timeout=0.4
            )
        assert time.monotonic() - started < 0.4 + REFUSAL_SLACK


def test_connections_outside_the_pool_are_opened_like_the_pool_s(secure_postgresql: ServerHandle) -> None:
    """The LISTEN connection is opened with the pool's parameters: TLS with the server verified
    (``verify-full``), the server options and the application name. (It was opened from the URL
    alone: libpq's default ``sslmode=prefer``, an unverified server, no ``connect_timeout``.)"""
    import psycopg  # noqa: PLC0415 - the postgresql extra

    base, options, _ = _split(secure_postgresql)
    plain = base.replace("postgresql+psycopg://", "postgresql://")
    with (
        ca.connect(base, **options),
        psycopg.connect(
            plain, sslmode="verify-full", sslrootcert=options["tls_ca"], autocommit=True
        ) as admin,
    ):
        query = (
            "SELECT a.query, a.application_name, s.ssl FROM pg_stat_activity a JOIN pg_stat_ssl s"
            " ON s.pid = a.pid WHERE a.usename = current_user AND a.pid <> pg_backend_pid()"
        )
        deadline = time.monotonic() + 10
        while not [row for row in admin.execute(query) if row[0].startswith("LISTEN")]:
            assert time.monotonic() < deadline, "no LISTEN connection"
            time.sleep(0.05)
        connections = admin.execute(query).fetchall()
    assert {(name, ssl) for _, name, ssl in connections} == {(APPLICATION_NAME, True)}, connections


@pytest.mark.parametrize("prefix", ['x"; drop table t; --', "a b", "", "x" * 41])
def test_table_prefix_is_restricted(secure_postgresql: ServerHandle, prefix: str) -> None:
    base, options, _ = _split(secure_postgresql)
    with pytest.raises(ca.ConfigurationError, match="table_prefix"):
        ca.connect(base, **options, table_prefix=prefix)
