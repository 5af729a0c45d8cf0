"""Settings of the Kafka backend: brokers and names from the URL, security options and timing.

``kafka://user:secret@b1:9092,b2:9092/prefix`` names the brokers and a prefix
for every topic and group this backend uses (``layout``). The common security options
(<https://consensus-api.github.io/consensus-api/spec/#2-connecting>) map to kafka-python's:
``tls`` selects ``SSL``, a user name ``SASL_SSL`` (``SASL_PLAINTEXT`` without TLS, with the core's warning),
with ``SCRAM-SHA-512`` unless ``sasl_mechanism`` says otherwise; the server's
host name is always checked. kafka-python's ``ssl_*``/``sasl_*`` names are
aliases. Credentials and the TLS key password reach kafka-python only as
:class:`Secret` strings, whose ``repr`` is masked, so kafka-python's own
debug logging of its configuration cannot reveal them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from consensus_api.config import Alias, BackendURL, OptionParser, Options, Secret, boolean
from consensus_api.errors import ConfigurationError
from consensus_backends.kafka.layout import Layout

DEFAULT_PORT = 9092
CLIENT_ID = "consensus-api"
#: Largest command record: a 1 MiB value plus key, headers and batch overhead.
MAX_RECORD_BYTES = 2 * 1024 * 1024
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
DEFAULT_SASL_MECHANISM = "SCRAM-SHA-512"


def _choice(*allowed: str) -> Callable[[Any], str]:
    def parse(value: Any) -> str:
        text = str(value).strip().upper()
        if text not in allowed:
            raise ValueError(f"expected one of {', '.join(allowed)}, got {value!r}")
        return text

    return parse


OPTIONS: Mapping[str, OptionParser] = {
    "tls": boolean,
    "sasl_mechanism": _choice(*SASL_MECHANISMS),
    "sasl_username": Alias("username"),
    "sasl_password": Alias("password"),
    "ssl_cafile": Alias("tls_ca"),
    "ssl_certfile": Alias("tls_cert"),
    "ssl_keyfile": Alias("tls_key"),
    "ssl_password": Alias("tls_key_password"),
}


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything the backend derives from the URL and options, checked before any I/O."""

    bootstrap: str
    layout: Layout
    session_ms: int
    #: The heartbeat interval of a Coordinator's Kafka member (which learns of rebalances from it).
    heartbeat_ms: int
    #: The heartbeat interval of members and candidates: a third of the session timeout (Kafka's
    #: advice), at most 3 s; they learn of rebalances from the driver's listing, not from it.
    member_heartbeat_ms: int
    rebalance_ms: int
    request_timeout: float
    connect_timeout: float
    session_timeout: float
    security: Mapping[str, Any] = field(default_factory=dict, repr=False)

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
    layout = Layout.from_path(url.path)
    session_ms = round(options.session_timeout * 1000)
    heartbeat_ms = min(1000, max(1, session_ms // 6))
    return Settings(
        bootstrap=url.host_list(DEFAULT_PORT),
        layout=layout,
        session_ms=session_ms,
        heartbeat_ms=heartbeat_ms,
        member_heartbeat_ms=max(heartbeat_ms, min(3000, session_ms // 3)),
        rebalance_ms=max(30_000, 3 * session_ms),
        request_timeout=options.request_timeout,
        connect_timeout=options.connect_timeout,
        session_timeout=options.session_timeout,
        security=_security(options),
    )


def _security(options: Options) -> dict[str, Any]:
    """kafka-python's security settings; ``ConfigurationError`` for a password without a user name."""
    security = options.security
    config: dict[str, Any] = {"security_protocol": "SSL" if security.tls else "PLAINTEXT"}
    if security.tls:
        config["ssl_context"] = security.ssl_context()
    if security.password is not None and security.username is None:
        raise ConfigurationError("a Kafka password needs a user name: kafka://user:password@host/prefix")
    if security.username is not None:
        if security.password is None:
            raise ConfigurationError("a Kafka user needs a password: kafka://user:password@host/prefix")
        config.update(
            security_protocol="SASL_SSL" if security.tls else "SASL_PLAINTEXT",
            sasl_mechanism=options.extra.get("sasl_mechanism", DEFAULT_SASL_MECHANISM),
            sasl_plain_username=security.username,
            sasl_plain_password=Secret(security.password),
        )
    return config
