"""Certificates made at test time (trustme): a CA, server and client certificates, and bad ones.

``write_certificates(directory)`` writes PEM files every secured test server
and the security tests use:

* ``ca.pem``: the test CA; ``server.pem``/``server.key``: for ``127.0.0.1`` and
  ``localhost``; ``client.pem``/``client.key``: a client certificate (CN ``client``);
* ``keystore.pem``: ``server.key`` followed by ``server.pem`` (ZooKeeper's PEM keystore);
* ``other-host.pem``/``.key``: signed by the CA for ``evil.example`` only;
* ``expired.pem``/``.key``: signed by the CA for ``127.0.0.1``, expired a day ago;
* ``other-ca.pem`` with ``impostor.pem``/``.key``: another CA and a ``127.0.0.1`` certificate it signed.

``Impostor`` serves one of them, to prove a client refuses it before sending anything.
"""

from __future__ import annotations

import datetime
import socket
import ssl
import threading
from pathlib import Path

import trustme
from cryptography.hazmat.primitives import serialization

HOSTS = ("127.0.0.1", "localhost")


def _write(leaf: trustme.LeafCert, directory: Path, name: str) -> None:
    """The certificate, and its key as unencrypted PKCS#8 (the only form ZooKeeper's PEM reader takes)."""
    key = serialization.load_pem_private_key(leaf.private_key_pem.bytes(), password=None)
    (directory / f"{name}.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    leaf.cert_chain_pems[0].write_to_path(str(directory / f"{name}.pem"))


def write_certificates(directory: Path) -> Path:
    """Write the files listed in the module docstring into ``directory``; returns ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    authority = trustme.CA(organization_name="consensus-api test CA", key_type=trustme.KeyType.RSA)
    authority.cert_pem.write_to_path(str(directory / "ca.pem"))
    rsa = trustme.KeyType.RSA
    _write(authority.issue_cert(*HOSTS, common_name="127.0.0.1", key_type=rsa), directory, "server")
    _write(authority.issue_cert("client", common_name="client", key_type=rsa), directory, "client")
    (directory / "keystore.pem").write_bytes(
        (directory / "server.key").read_bytes() + (directory / "server.pem").read_bytes()
    )
    _write(authority.issue_cert("evil.example", key_type=rsa), directory, "other-host")
    now = datetime.datetime.now(datetime.UTC)
    expired = authority.issue_cert(
        *HOSTS,
        not_before=now - datetime.timedelta(days=3),
        not_after=now - datetime.timedelta(days=1),
        key_type=rsa,
    )
    _write(expired, directory, "expired")
    other = trustme.CA(organization_name="impostor CA", key_type=rsa)
    other.cert_pem.write_to_path(str(directory / "other-ca.pem"))
    _write(other.issue_cert(*HOSTS, key_type=rsa), directory, "impostor")
    for key in directory.glob("*.key"):
        key.chmod(0o600)
    return directory


#: The 8 bytes a PostgreSQL client sends to ask for TLS (length 8, code 80877103).
POSTGRESQL_SSL_REQUEST = bytes.fromhex("0000000804d2162f")


class Impostor:
    """A TLS endpoint on a free loopback port presenting ``<name>.pem`` from a certificates directory.

    It accepts connections, completes the handshake when the client lets it,
    and counts the application bytes it receives (``received``): a client that
    refuses the certificate sends none. A PostgreSQL client's ``SSLRequest``
    before the handshake is answered as a server would. A context manager; stops within 1 s.
    """

    def __init__(self, certificates: Path, name: str) -> None:
        self.received = 0
        self.handshakes = 0
        self._context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._context.load_cert_chain(certificates / f"{name}.pem", certificates / f"{name}.key")
        self._context.set_alpn_protocols(["h2", "postgresql"])
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.port: int = self._listener.getsockname()[1]
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="tls-impostor", daemon=True)

    def __enter__(self) -> Impostor:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stopped.set()
        self._thread.join(timeout=5)
        self._listener.close()

    def _serve(self) -> None:
        while not self._stopped.is_set():
            try:
                connection, _ = self._listener.accept()
            except TimeoutError:
                continue
            with connection:
                connection.settimeout(1.0)
                try:
                    if connection.recv(8, socket.MSG_PEEK) == POSTGRESQL_SSL_REQUEST:
                        connection.recv(8)
                        connection.sendall(b"S")
                    with self._context.wrap_socket(connection, server_side=True) as tls:
                        self.handshakes += 1
                        while chunk := tls.recv(65536):
                            self.received += len(chunk)
                except (OSError, ssl.SSLError):
                    continue
