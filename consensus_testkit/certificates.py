"""Certificates made at test time (trustme): a CA, server and client certificates, and bad ones.

``write_certificates(directory)`` writes PEM files every secured test server
and the security tests use:

* ``ca.pem``: the test CA; ``server.pem``/``server.key``: for ``127.0.0.1`` and
  ``localhost``; ``client.pem``/``client.key``: a client certificate (CN ``client``);
* ``keystore.pem``: ``server.key`` followed by ``server.pem`` (ZooKeeper's PEM keystore);
* ``other-host.pem``/``.key``: signed by the CA for ``evil.example`` only;
* ``expired.pem``/``.key``: signed by the CA for ``127.0.0.1``, expired a day ago;
* ``other-ca.pem`` with ``impostor.pem``/``.key``: another CA and a ``127.0.0.1`` certificate it signed;
* ``self-signed.pem``/``.key``: a ``127.0.0.1`` certificate signed by its own key.

``Impostor`` serves one of them, to prove a client refuses it before sending anything.
"""

from __future__ import annotations

import datetime
import ipaddress
import socket
import ssl
import struct
import threading
from pathlib import Path

import trustme
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa as rsa_keys
from cryptography.x509.oid import NameOID

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
    _write_self_signed(directory, "self-signed")
    for key in directory.glob("*.key"):
        key.chmod(0o600)
    return directory


def _write_self_signed(directory: Path, name: str) -> None:
    """A certificate for ``HOSTS`` that its own key signs (no CA vouches for it)."""
    key = rsa_keys.generate_private_key(public_exponent=65537, key_size=2048)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, HOSTS[0])])
    now = datetime.datetime.now(datetime.UTC)
    names = [x509.IPAddress(ipaddress.ip_address(HOSTS[0])), x509.DNSName(HOSTS[1])]
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .sign(key, hashes.SHA256())
    )
    (directory / f"{name}.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    (directory / f"{name}.pem").write_bytes(certificate.public_bytes(serialization.Encoding.PEM))


#: The 8 bytes a PostgreSQL client sends to ask for TLS (length 8, code 80877103).
POSTGRESQL_SSL_REQUEST = bytes.fromhex("0000000804d2162f")
#: How long a client may stay silent before the impostor greets it as a MySQL or MariaDB server does
#: (there the server speaks first; every other client here begins at once).
SERVER_FIRST_WAIT = 0.5
#: The first byte of a TLS record that carries a handshake message: how a ClientHello begins.
TLS_HANDSHAKE_RECORD = 0x16
#: MySQL's capability flag "the client asks for TLS" (``CLIENT_SSL``).
MYSQL_CLIENT_SSL = 0x800


def _mysql_greeting() -> bytes:
    """A MariaDB server's first packet (protocol 10, sequence 0) offering TLS and
    ``mysql_native_password``: long password, with database, protocol 4.1, TLS, transactions, secure
    connection, plugin auth."""
    capabilities = 0x1 | 0x8 | 0x200 | MYSQL_CLIENT_SSL | 0x2000 | 0x8000 | 0x80000
    scramble = b"impostor-scramble-20"
    payload = b"".join(
        [
            bytes([10]),
            b"5.5.5-10.11.0-MariaDB-impostor\0",
            struct.pack("<I", 1),  # connection id
            scramble[:8] + b"\0",
            struct.pack("<HBHH", capabilities & 0xFFFF, 33, 2, capabilities >> 16),  # charset, status
            bytes([len(scramble) + 1]) + bytes(10),
            scramble[8:] + b"\0",
            b"mysql_native_password\0",
        ]
    )
    return len(payload).to_bytes(3, "little") + b"\0" + payload


MYSQL_GREETING = _mysql_greeting()


class Impostor:
    """A TLS endpoint on a free loopback port presenting ``<name>.pem`` from a certificates directory.

    It accepts connections, completes the handshake when the client lets it
    (asking for a client certificate the directory's ``ca.pem`` signed, which
    the client may omit), and counts what clients did: ``connections``
    accepted, ``hellos`` (connections that began a TLS handshake),
    ``handshakes`` completed, ``received``: the bytes of clients' own data, sent
    inside TLS or without it (a client that refuses the certificate sends none),
    and ``client_names``: the common names of the client certificates presented.
    A PostgreSQL client's ``SSLRequest`` before the handshake is answered as a
    server would; a client silent for ``SERVER_FIRST_WAIT`` is greeted as a
    MariaDB server offering TLS greets, and its request to begin TLS is taken.
    A context manager; stops within 1 s.
    """

    def __init__(self, certificates: Path, name: str) -> None:
        self.connections = 0
        self.hellos = 0
        self.handshakes = 0
        self.received = 0
        self.client_names: list[str] = []
        self._context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=certificates / "ca.pem")
        self._context.verify_mode = ssl.CERT_OPTIONAL
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
            self.connections += 1
            with connection:
                try:
                    self._answer(connection)
                except (OSError, ssl.SSLError):
                    continue

    def _answer(self, connection: socket.socket) -> None:
        """Take the protocol's steps before TLS, then the handshake and the client's data."""
        connection.settimeout(SERVER_FIRST_WAIT)
        try:
            opening = connection.recv(8, socket.MSG_PEEK)
        except TimeoutError:  # the client waits for the server's greeting
            opening = b""
            connection.settimeout(1.0)
            connection.sendall(MYSQL_GREETING)
            header = _read_exactly(connection, 4)
            length, sequence = int.from_bytes(header[:3], "little"), header[3]
            request = _read_exactly(connection, length)
            flags = struct.unpack_from("<I", request)[0] if length >= 4 else 0
            if sequence != 1 or not flags & MYSQL_CLIENT_SSL:
                self.received += len(header) + len(request)  # a login without TLS
        connection.settimeout(1.0)
        if opening == POSTGRESQL_SSL_REQUEST:
            connection.recv(8)
            connection.sendall(b"S")
        if connection.recv(1, socket.MSG_PEEK)[:1] != bytes([TLS_HANDSHAKE_RECORD]):
            while chunk := connection.recv(65536):  # no TLS: everything the client sends counts
                self.received += len(chunk)
            return
        self.hellos += 1
        with self._context.wrap_socket(connection, server_side=True) as tls:
            self.handshakes += 1
            presented = tls.getpeercert(binary_form=True)
            if presented is not None:
                subject = x509.load_der_x509_certificate(presented).subject
                self.client_names += [
                    str(a.value) for a in subject.get_attributes_for_oid(NameOID.COMMON_NAME)
                ]
            while chunk := tls.recv(65536):
                self.received += len(chunk)


def _read_exactly(connection: socket.socket, size: int) -> bytes:
    """``size`` bytes from ``connection``; ``ConnectionError`` if it ends first."""
    data = b""
    while len(data) < size:
        chunk = connection.recv(size - len(data))
        if not chunk:
            raise ConnectionError("the client closed the connection")
        data += chunk
    return data
