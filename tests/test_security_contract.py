"""Every registered backend honours each TLS option the core parses, or refuses it before any I/O.

The core parses the security options once (``Options.security``); a backend
that never reads one would drop it silently (MariaDB once connected in
plaintext with ``tls=true``). Against an ``Impostor`` (a TLS endpoint that
counts connections, handshakes, client certificates and the bytes clients send)
each option either shows its effect, or ``connect`` raises
``ConfigurationError`` with no connection made. An option the core parses
without a case here fails the walk. The credentials (``username``,
``password``) are used at login, which only a real server can show: the
conformance suite's security section checks them on every secured server, given
in the URL and as options.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

import consensus_api as ca
from consensus_api import registry
from consensus_api.config import SECURITY_OPTIONS
from consensus_testkit.certificates import Impostor, write_certificates

#: Options used at login only (see the module docstring).
CREDENTIALS = {"username", "password"}
#: The password of ``client-encrypted.key``.
KEY_PASSWORD = "client-key-password"
#: Bounds each attempt: a backend that completes the handshake then waits for an answer gives up by then.
TIMEOUTS = {"connect_timeout": 2.0, "request_timeout": 2.0}
#: URLs of backends that take no host (a database file); every other backend gets the impostor's address.
FILE_URLS = {"sqlite": "sqlite:///{directory}/consensus.db"}


@dataclass(frozen=True)
class Case:
    """One option's effect: the options given (``{certs}`` stands for the certificates directory), the
    certificate the impostor presents, and what it sees when the option is honoured."""

    options: Mapping[str, object]
    presented: str
    honoured: Callable[[Impostor], bool]
    effect: str


def _refused_before_data(impostor: Impostor) -> bool:
    """The client began TLS and sent nothing of its own (libpq checks the host name after the
    handshake: it then hangs up)."""
    return impostor.hellos > 0 and impostor.received == 0


def _data_over_tls(impostor: Impostor) -> bool:
    return impostor.handshakes > 0 and impostor.received > 0


CA_FILE = "{certs}/ca.pem"
CLIENT = {"tls_ca": CA_FILE, "tls_cert": "{certs}/client.pem"}

CASES: dict[str, Case] = {
    "tls": Case(
        {"tls": True},
        "server",
        _refused_before_data,
        "TLS, the chain checked against the system's trust store: the test CA's certificate is refused",
    ),
    "tls_ca": Case(
        {"tls_ca": CA_FILE},
        "server",
        _data_over_tls,
        "the chain checked against tls_ca: the test CA's certificate is accepted",
    ),
    "host name": Case(
        {"tls_ca": CA_FILE},
        "other-host",
        _refused_before_data,
        "the host name checked by default: a certificate for another name is refused",
    ),
    "tls_cert": Case(
        {**CLIENT, "tls_key": "{certs}/client.key"},
        "server",
        lambda impostor: "client" in impostor.client_names,
        "the client certificate presented",
    ),
    "tls_key_password": Case(
        {**CLIENT, "tls_key": "{certs}/client-encrypted.key", "tls_key_password": KEY_PASSWORD},
        "server",
        lambda impostor: "client" in impostor.client_names,
        "the client certificate presented, its key decrypted with tls_key_password",
    ),
    # Not a core option: the core refuses it as unknown, before any I/O, until backends honour it.
    "tls_server_name": Case(
        {"tls_ca": CA_FILE, "tls_server_name": "evil.example"},
        "other-host",
        _data_over_tls,
        "the server's certificate checked for tls_server_name instead of the URL's host",
    ),
}


@cache
def _backends() -> tuple[str, ...]:
    """Every registered scheme, without ``name+driver`` when ``name`` names the same backend."""
    targets = {ep.name: ep.value for ep in entry_points(group=registry.GROUP)}
    return tuple(
        sorted(
            scheme
            for scheme in registry.schemes()
            if targets.get(scheme.partition("+")[0]) != targets.get(scheme) or "+" not in scheme
        )
    )


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = write_certificates(tmp_path_factory.mktemp("certs"))
    key = serialization.load_pem_private_key((directory / "client.key").read_bytes(), password=None)
    (directory / "client-encrypted.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(KEY_PASSWORD.encode()),
        )
    )
    return directory


def test_every_security_option_has_a_case() -> None:
    assert set(SECURITY_OPTIONS) - CREDENTIALS <= {name for case in CASES.values() for name in case.options}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("scheme", _backends())
def test_a_security_option_is_honoured_or_refused_before_any_io(
    scheme: str, case: str, certificates: Path, tmp_path: Path
) -> None:
    given = CASES[case]
    options = {
        name: value.format(certs=certificates) if isinstance(value, str) else value
        for name, value in given.options.items()
    }
    with Impostor(certificates, given.presented) as impostor:
        url = FILE_URLS.get(scheme, f"{scheme}://127.0.0.1:{impostor.port}/consensus")
        with pytest.raises(ca.ConsensusError) as failed:
            ca.connect(url.format(directory=tmp_path), **options, **TIMEOUTS).close()
    refusal = failed.value
    if isinstance(refusal, ca.ConfigurationError) and impostor.connections == 0:
        return  # refused before any I/O
    assert given.honoured(impostor), (
        f"{scheme} dropped {case}: expected {given.effect}; the impostor saw {impostor.connections} "
        f"connections, {impostor.hellos} TLS hellos, {impostor.handshakes} handshakes, "
        f"{impostor.received} bytes, client certificates {impostor.client_names} ({refusal})"
    )
