"""The ZooKeeper backend's configuration checks, digest authentication and TLS, against real servers."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

import pytest

import consensus_api as ca
from consensus_api import ConfigurationError, Versioned
from consensus_testkit import ServerHandle, start_server
from consensus_testkit.certificates import Impostor
from consensus_testkit.host import HOST, free_port


@pytest.mark.parametrize(
    ("suffix", "options", "message"),
    [
        ("/a/../b", {}, "not a valid ZooKeeper path"),
        ("/x", {"tls_cert": "/nonexistent.pem"}, "no such file"),
        ("/x", {"tls": False, "tls_ca": __file__}, "need tls=true"),
        ("/x", {"tls_key_password": "x"}, "needs 'tls_key'"),
        ("/x", {"tls_cert": __file__}, "given together"),
    ],
)
def test_bad_configuration_is_refused_before_io(suffix: str, options: dict[str, Any], message: str) -> None:
    """A bad chroot or inconsistent TLS options raise ConfigurationError without connecting."""
    with pytest.raises(ConfigurationError, match=message):
        ca.connect(f"zookeeper://{HOST}:{free_port()}{suffix}", **options)
    with pytest.raises(ConfigurationError, match="user and a password"):
        ca.connect(f"zookeeper://alice@{HOST}:{free_port()}/x")


def test_digest_auth_restricts_the_chroot(
    zk_server: ServerHandle, zk_chroot: str, caplog: pytest.LogCaptureFixture
) -> None:
    """user:password creates digest-ACLed znodes; a wrong or missing password is refused clearly,
    and the password never appears in a log record, not even in kazoo's DEBUG output."""
    caplog.set_level(logging.DEBUG)
    secret = f"pw-{uuid.uuid4().hex}"
    hosts = f"{HOST}:{zk_server.port}"
    with ca.connect(f"zookeeper://alice:{secret}@{hosts}{zk_chroot}") as session:
        session.storage.put("k", b"v")
        assert session.storage.fetch("k") is not None
    for url in (f"zookeeper://alice:wrong@{hosts}{zk_chroot}", f"zookeeper://{hosts}{zk_chroot}"):
        with pytest.raises(ConfigurationError, match="refused access") as info:
            ca.connect(url)
        assert secret not in str(info.value) and "wrong" not in str(info.value)
    messages = [record.getMessage() for record in caplog.records]
    assert not [message for message in messages if secret in message]
    assert any("alice:***" in message for message in messages), "kazoo's auth request was not logged"


@pytest.fixture(scope="module")
def secure_server() -> Iterator[ServerHandle]:
    """A ZooKeeper serving TLS only (client certificates required), digest auth, an ACLed chroot."""
    with start_server("zookeeper", secure=True) as handle:
        yield handle


def _secure(handle: ServerHandle, **changes: str) -> tuple[str, dict[str, str]]:
    """The secure server's URL without its query, and its options with ``changes``."""
    base, _, query = handle.url.partition("?")
    return base, {**dict(parse_qsl(query)), **changes}


def test_tls_with_auth_and_client_certificate(secure_server: ServerHandle) -> None:
    """TLS with a client certificate and digest auth; without the certificate the server refuses."""
    url, options = _secure(secure_server)
    with ca.connect(url, **options) as session:
        version = session.storage.put("k", b"over tls")
        assert session.storage.fetch("k") == Versioned(b"over tls", version)
    with pytest.raises(ca.ConsensusError):
        ca.connect(url, tls=True, tls_ca=options["tls_ca"], connect_timeout=2)


@pytest.mark.parametrize(
    ("presented", "cause"),
    [("other-host", "mismatch"), ("expired", "expired"), ("impostor", "unable to get local issuer")],
)
def test_tls_refuses_a_bad_server_certificate_before_sending_anything(
    secure_server: ServerHandle, presented: str, cause: str
) -> None:
    """A certificate for another host name, an expired one, or one from another CA (kazoo would accept
    the first, and any publicly trusted one) ends connect at once; the endpoint receives no byte."""
    url, options = _secure(secure_server)
    certificates = Path(options["tls_ca"]).parent
    with Impostor(certificates, presented) as impostor:
        started = time.monotonic()
        with pytest.raises(ConfigurationError, match=f"TLS certificate was refused: .*{cause}") as refused:
            ca.connect(url.replace(f":{secure_server.port}/", f":{impostor.port}/"), **options)
        assert time.monotonic() - started < 2.0
    assert impostor.received == 0 and impostor.handshakes == 0
    assert url.split(":")[2].split("@")[0] not in str(refused.value)


def test_tls_ca_alone_is_trusted(secure_server: ServerHandle) -> None:
    """With tls_ca naming another CA, the real server is refused (no system CA is added)."""
    url, options = _secure(secure_server)
    other_ca = str(Path(options["tls_ca"]).parent / "other-ca.pem")
    with pytest.raises(ConfigurationError, match="unable to get local issuer"):
        ca.connect(url, **{**options, "tls_ca": other_ca}, connect_timeout=5)
