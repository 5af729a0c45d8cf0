"""MariaDB with ``tls=true``: the server's certificate is verified before the login is sent; a server
without TLS or with a certificate nobody vouches for (self-signed) is a clear ``ConfigurationError`` at
once, never a plaintext or unverified login."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qsl

import pytest

import consensus_api as ca
from consensus_testkit import ServerHandle, start_server
from consensus_testkit.certificates import Impostor, write_certificates

#: Slack for a refused connect on a loaded 2-core machine.
REFUSAL_SLACK = 1.0


def _refused(url: str, **options: object) -> ca.ConfigurationError:
    """``connect`` refused at once (never retried until ``connect_timeout``); the error."""
    started = time.monotonic()
    with pytest.raises(ca.ConfigurationError) as refused:
        ca.connect(url, connect_timeout=10, **options).close()
    assert time.monotonic() - started < REFUSAL_SLACK, f"retried? {refused.value}"
    return refused.value


@pytest.fixture(scope="module")
def self_signed_mariadb() -> Iterator[ServerHandle]:
    """A MariaDB serving TLS only, with a self-signed certificate (its secure variant's, replaced)."""
    with start_server("mariadb", secure=True) as handle:
        certs = handle.directory / "certs"
        for suffix in ("pem", "key"):
            (certs / f"server.{suffix}").write_bytes((certs / f"self-signed.{suffix}").read_bytes())
        handle.restart()
        yield handle


def test_tls_against_a_server_without_tls_fails_at_once(mariadb_server: ServerHandle) -> None:
    error = _refused(mariadb_server.url, tls=True)
    assert "TLS: the server does not support TLS" in str(error), error


def test_tls_against_a_self_signed_certificate_fails_naming_it(self_signed_mariadb: ServerHandle) -> None:
    """Neither the system's trust store nor the test CA vouches for the server's certificate: refused,
    saying so and why, with no password in the message."""
    base, _, query = self_signed_mariadb.url.partition("?")
    password = base.split("@")[0].rsplit(":", 1)[1]
    for options in ({"tls": True}, dict(parse_qsl(query))):
        error = _refused(base, **options)
        assert "TLS: the server's certificate was refused" in str(error), error
        assert "self-signed certificate" in str(error), error
        assert password not in str(error)


def test_a_self_signed_certificate_gets_no_login(mariadb_server: ServerHandle, tmp_path: Path) -> None:
    """The same certificate presented by an endpoint that greets as MariaDB does and counts what it
    receives: the client begins TLS, refuses it, and sends nothing (no user name, no password)."""
    certificates = write_certificates(tmp_path / "certs")
    with Impostor(certificates, "self-signed") as impostor:
        url = mariadb_server.url.replace(f":{mariadb_server.port}/", f":{impostor.port}/")
        error = _refused(url, tls=True)
    assert "self-signed certificate" in str(error), error
    assert (impostor.hellos, impostor.received) == (1, 0)
