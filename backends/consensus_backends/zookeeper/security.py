"""Credentials and TLS for kazoo, and a logger that never shows a secret.

``zookeeper://user:password@hosts/chroot`` authenticates with the ``digest``
scheme and creates every znode with an ACL that admits only that identity, so
a wrong password is refused (``NoAuth``) on the chroot. kazoo logs its
requests at DEBUG, the digest credential included; its logger here replaces
the password and the derived digest with ``***`` before anything is emitted.
kazoo warns at every failed reconnect attempt; those warnings are logged at
INFO, since the session states already report the outage.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Any

from kazoo.security import make_digest_acl, make_digest_acl_credential

from consensus_api.config import BackendURL, OptionParser, boolean, string
from consensus_api.errors import ConfigurationError

#: The backend's own options (besides the common ones).
OPTIONS: Mapping[str, OptionParser] = {
    "tls": boolean,
    "tls_ca": string,
    "tls_cert": string,
    "tls_key": string,
}

MASK = "***"


class RedactingLogger(logging.LoggerAdapter):  # type: ignore[type-arg]
    """A logger for kazoo that masks the given secrets in every message and demotes warnings to INFO."""

    def __init__(self, logger: logging.Logger, secrets: list[str]) -> None:
        super().__init__(logger, {})
        self._secrets = sorted((s for s in secrets if s), key=len, reverse=True)

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        """Render the message, mask the secrets, then log it without arguments."""
        if level == logging.WARNING:
            level = logging.INFO
        if not self.isEnabledFor(level):
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


class Security:
    """Digest authentication and TLS settings for one backend."""

    def __init__(self, url: BackendURL, extra: Mapping[str, object]) -> None:
        self._username = url.username
        self._password = url.password
        if self._username is not None and not self._password:
            raise ConfigurationError(
                "ZooKeeper digest authentication needs a user and a password: zookeeper://user:password@host/app"
            )
        self._ca = _existing_file(extra, "tls_ca")
        self._cert = _existing_file(extra, "tls_cert")
        self._key = _existing_file(extra, "tls_key")
        if (self._cert is None) != (self._key is None):
            raise ConfigurationError("options 'tls_cert' and 'tls_key' must be given together")
        wants_tls = any(path is not None for path in (self._ca, self._cert, self._key))
        self._tls = bool(extra.get("tls", wants_tls))
        if wants_tls and not self._tls:
            raise ConfigurationError("options 'tls_ca', 'tls_cert' and 'tls_key' need tls=true")
        secrets = []
        if self._username is not None and self._password:
            digest = make_digest_acl_credential(self._username, self._password)
            secrets = [self._password, digest.partition(":")[2]]
        self.logger = RedactingLogger(logging.getLogger("consensus_api.zookeeper.kazoo"), secrets)

    def client_arguments(self) -> dict[str, Any]:
        """Keyword arguments for ``KazooClient``: auth data, default ACL and TLS."""
        arguments: dict[str, Any] = {}
        if self._username is not None and self._password:
            arguments["auth_data"] = [("digest", f"{self._username}:{self._password}")]
            arguments["default_acl"] = [make_digest_acl(self._username, self._password, all=True)]
        if self._tls:
            arguments.update(use_ssl=True, ca=self._ca, certfile=self._cert, keyfile=self._key)
        return arguments


def _existing_file(extra: Mapping[str, object], name: str) -> str | None:
    value = extra.get(name)
    if value is None:
        return None
    path = str(value)
    if not Path(path).is_file():
        raise ConfigurationError(f"option {name!r}: no such file: {path}")
    return path
