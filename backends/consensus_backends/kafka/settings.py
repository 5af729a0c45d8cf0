"""Settings of the Kafka backend: names from the URL, security options and timing.

``kafka://user:secret@b1:9092,b2:9092/prefix`` names the brokers and a prefix
for every topic and group this backend uses. Credentials (URL userinfo or the
``sasl_*`` options) and the TLS key password reach kafka-python only as
:class:`Secret` strings, whose ``repr`` is masked, so kafka-python's own
debug logging of its configuration cannot reveal them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from consensus_api.config import BackendURL, OptionParser, Options, boolean, string
from consensus_api.errors import ConfigurationError

DEFAULT_PORT = 9092
DEFAULT_PREFIX = "consensus"
CLIENT_ID = "consensus-api"
#: Largest command record: a 1 MiB value plus key, headers and batch overhead.
MAX_RECORD_BYTES = 2 * 1024 * 1024
SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
_PREFIX_RE = re.compile(r"[A-Za-z0-9._-]{1,200}")


class Secret(str):
    """A credential: a ``str`` whose ``repr`` never shows its value."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "'***'"


def _choice(*allowed: str) -> Callable[[Any], str]:
    def parse(value: Any) -> str:
        text = str(value).strip().upper()
        if text not in allowed:
            raise ValueError(f"expected one of {', '.join(allowed)}, got {value!r}")
        return text

    return parse


def _secret(value: Any) -> Secret:
    if not isinstance(value, str) or not value:
        raise ValueError("expected a non-empty string")
    return Secret(value)


OPTIONS: Mapping[str, OptionParser] = {
    "security_protocol": _choice(*SECURITY_PROTOCOLS),
    "sasl_mechanism": _choice(*SASL_MECHANISMS),
    "sasl_username": string,
    "sasl_password": _secret,
    "ssl_cafile": string,
    "ssl_certfile": string,
    "ssl_keyfile": string,
    "ssl_password": _secret,
    "ssl_check_hostname": boolean,
}


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything the backend derives from the URL and options, checked before any I/O."""

    bootstrap: str
    prefix: str
    session_ms: int
    heartbeat_ms: int
    rebalance_ms: int
    request_timeout: float
    connect_timeout: float
    session_timeout: float
    security: Mapping[str, Any] = field(default_factory=dict, repr=False)

    @property
    def topic(self) -> str:
        """The single-partition topic holding the command log."""
        return f"{self.prefix}.kv"

    def group_id(self, group: str) -> str:
        """The Kafka group id of a membership group."""
        return f"{self.prefix}.group.{group}"

    def election_id(self, service: str) -> str:
        """The Kafka group id of an election."""
        return f"{self.prefix}.election.{service}"

    def client(self, **extra: Any) -> dict[str, Any]:
        """Keyword arguments shared by every kafka-python client of this backend."""
        return {
            "bootstrap_servers": self.bootstrap,
            "client_id": CLIENT_ID,
            "request_timeout_ms": int(self.request_timeout * 1000),
            "reconnect_backoff_ms": 50,
            "reconnect_backoff_max_ms": 1000,
            "retry_backoff_ms": 50,
            **self.security,
            **extra,
        }


def build(url: BackendURL, options: Options) -> Settings:
    """Check the URL and options; ``ConfigurationError`` names the bad part."""
    if not url.endpoints:
        raise ConfigurationError("a kafka:// URL needs at least one broker, e.g. kafka://127.0.0.1:9092/app")
    path = url.path.strip("/")
    prefix = path.replace("/", ".") if path else DEFAULT_PREFIX
    if not _PREFIX_RE.fullmatch(prefix):
        raise ConfigurationError(
            "the kafka:// URL path names the topic prefix: 1-200 characters of A-Z a-z 0-9 . _ - "
            f"(segments joined by '/'), got {url.path!r}"
        )
    session_ms = round(options.session_timeout * 1000)
    heartbeat_ms = min(1000, max(1, session_ms // 6))
    return Settings(
        bootstrap=url.host_list(DEFAULT_PORT),
        prefix=prefix,
        session_ms=session_ms,
        heartbeat_ms=heartbeat_ms,
        rebalance_ms=max(30_000, 3 * session_ms),
        request_timeout=options.request_timeout,
        connect_timeout=options.connect_timeout,
        session_timeout=options.session_timeout,
        security=_security(url, options.extra),
    )


def _security(url: BackendURL, extra: Mapping[str, object]) -> dict[str, Any]:
    username = extra.get("sasl_username", url.username)
    password = extra.get("sasl_password", Secret(url.password) if url.password is not None else None)
    ssl = {
        key: extra[key]
        for key in ("ssl_cafile", "ssl_certfile", "ssl_keyfile", "ssl_password", "ssl_check_hostname")
        if key in extra
    }
    default_protocol = "SSL" if ssl else "PLAINTEXT"
    if username is not None:
        default_protocol = "SASL_SSL" if ssl else "SASL_PLAINTEXT"
    protocol = str(extra.get("security_protocol", default_protocol))
    config: dict[str, Any] = {"security_protocol": protocol, **ssl}
    if protocol.startswith("SASL"):
        if username is None or password is None:
            raise ConfigurationError(
                f"security_protocol {protocol} needs a user name and password "
                "(kafka://user:password@host/prefix or the sasl_username and sasl_password options)"
            )
        config.update(
            sasl_mechanism=extra.get("sasl_mechanism", "PLAIN"),
            sasl_plain_username=username,
            sasl_plain_password=Secret(str(password)),
        )
    return config
