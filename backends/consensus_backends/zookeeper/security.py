"""Credentials and TLS for kazoo, and a logger that never shows a secret.

``zookeeper://user:password@hosts/chroot`` (or the ``username`` and
``password`` options) authenticates with the ``digest`` scheme and creates
every znode with an ACL that admits only that identity, so a wrong password is
refused (``NoAuth``) on the chroot. TLS connections are made by our own
handler with ``Security.ssl_context()``: the server's certificate chain and
host name are verified against ``tls_ca`` alone (kazoo's own context skips the
host name and adds the system CAs). A certificate that fails verification ends
``connect`` at once with ``ConfigurationError`` naming the cause; no request,
credentials included, is sent before the handshake succeeded. kazoo logs its
requests at DEBUG, the digest credential included; its logger here replaces
the password and the derived digest with ``***`` before anything is emitted.
kazoo warns at every failed reconnect attempt; those warnings are logged at
INFO, since the session states already report the outage.
"""

from __future__ import annotations

import logging
import socket
import ssl
import threading
from collections.abc import Mapping, MutableMapping
from typing import Any

from kazoo.handlers.threading import SequentialThreadingHandler
from kazoo.handlers.utils import create_tcp_connection
from kazoo.security import make_digest_acl, make_digest_acl_credential

from consensus_api import config
from consensus_api.config import OptionParser, boolean
from consensus_api.errors import ConfigurationError

#: The backend's own options: ``tls`` enables the common security options (<https://consensus-api.github.io/consensus-api/spec/#2-connecting>).
OPTIONS: Mapping[str, OptionParser] = {"tls": boolean}

MASK = "***"

#: Alerts with which a server refuses our client certificate (or its absence).
CLIENT_CERTIFICATE_REFUSED = frozenset(
    {"TLSV1_ALERT_UNKNOWN_CA", "SSLV3_ALERT_BAD_CERTIFICATE", "TLSV13_ALERT_CERTIFICATE_REQUIRED"}
)


class RedactingLogger(logging.LoggerAdapter):  # type: ignore[type-arg]
    """A logger for kazoo that masks the given secrets in every message and demotes warnings to INFO."""

    def __init__(self, logger: logging.Logger, secrets: list[str]) -> None:
        super().__init__(logger, {})
        self._secrets = sorted((s for s in secrets if s), key=len, reverse=True)

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        """Render the message, mask the secrets, then log it without arguments."""
        if level == logging.WARNING:
            level = logging.INFO
        if not self.logger.isEnabledFor(level):  # kazoo logs each request it queues, at level 5
            return
        try:
            text = str(msg) % args if args else str(msg)
        except (TypeError, ValueError):
            text = " ".join(str(part) for part in (msg, *args))
        for secret in self._secrets:
            text = text.replace(secret, MASK)
        kwargs.setdefault("stacklevel", 2)
        self.logger.log(level, "%s", text, **kwargs)

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        """No extra context is added."""
        return msg, kwargs


class VerifyingHandler(SequentialThreadingHandler):  # type: ignore[misc]
    """kazoo's threading handler, with TLS sockets from our own ``SSLContext``.

    The first certificate verification failure is kept in ``tls_failure`` and
    reported to ``on_failure`` (called on kazoo's connection thread).
    """

    def __init__(self, context: ssl.SSLContext) -> None:
        super().__init__()
        self._context = context
        self._failure_lock = threading.Lock()
        self.tls_failure: str | None = None
        self.on_failure: Any = None

    def create_connection(self, *args: Any, **kwargs: Any) -> Any:
        """A plain TCP connection, then the TLS handshake with our context (``use_ssl`` is ours to do)."""
        use_ssl = kwargs.pop("use_ssl", False)
        hostname = kwargs.pop("hostname", None)
        if not isinstance(hostname, str):  # kazoo's command() passes the peer's port: use its address
            hostname = (args[0] if args else kwargs["address"])[0]
        for name in ("ca", "certfile", "keyfile", "keyfile_password", "verify_certs", "check_hostname"):
            kwargs.pop(name, None)
        sock = create_tcp_connection(socket, *args, **kwargs)
        if not use_ssl:
            return sock
        try:
            return self._context.wrap_socket(sock, server_hostname=hostname)
        except ssl.SSLCertVerificationError as exc:
            sock.close()
            self._fail(f"the server's TLS certificate was refused: {exc.verify_message}")
            raise
        except ssl.SSLError as exc:
            sock.close()
            if exc.reason in CLIENT_CERTIFICATE_REFUSED:
                self._fail(f"the server refused our TLS client certificate ({exc.reason})")
            raise

    def _fail(self, reason: str) -> None:
        with self._failure_lock:
            if self.tls_failure is None:
                self.tls_failure = reason
        if self.on_failure is not None:
            self.on_failure()


class Security:
    """Digest authentication and TLS settings for one backend."""

    def __init__(self, security: config.Security) -> None:
        self._username = security.username
        self._password = security.password
        if self._username is not None and not self._password:
            raise ConfigurationError(
                "ZooKeeper digest authentication needs a user and a password: zookeeper://user:password@host/app"
            )
        self._tls = security.tls
        self.handler = VerifyingHandler(security.ssl_context()) if security.tls else None
        secrets = []
        if self._username is not None and self._password:
            digest = make_digest_acl_credential(self._username, self._password)
            secrets = [self._password, digest.partition(":")[2]]
        self.logger = RedactingLogger(logging.getLogger("consensus_api.zookeeper.kazoo"), secrets)

    @property
    def tls_failure(self) -> str | None:
        """Why the server's (or our) certificate was refused, once that happened."""
        return None if self.handler is None else self.handler.tls_failure

    def client_arguments(self) -> dict[str, Any]:
        """Keyword arguments for ``KazooClient``: auth data, default ACL and TLS."""
        arguments: dict[str, Any] = {}
        if self._username is not None and self._password:
            arguments["auth_data"] = [("digest", f"{self._username}:{self._password}")]
            arguments["default_acl"] = [make_digest_acl(self._username, self._password, all=True)]
        if self.handler is not None:
            arguments.update(use_ssl=True, handler=self.handler)
        return arguments
