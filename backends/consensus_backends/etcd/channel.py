"""How the etcd client reaches one member: TLS material, channel options, pyetcd endpoints."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import grpc
import pyetcd

#: How long pyetcd skips an endpoint marked failed.
FAILED_ENDPOINT_PAUSE = 0.5

#: Reconnect quickly after a server restart; detect dead connections under an idle watch
#: (etcd refuses pings more often than every 5 s); no cap on response sizes.
CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.max_receive_message_length", -1),
]


@dataclass(frozen=True, slots=True)
class TLS:
    """PEM contents for a TLS connection; None means the default (system roots, no client cert)."""

    ca: bytes | None
    cert: bytes | None
    key: bytes | None


def open_endpoint(host: str, port: int, tls: TLS | None) -> Any:
    """A pyetcd endpoint (with a new channel) for ``host:port``, over TLS when ``tls`` is given."""
    return pyetcd.Endpoint(
        _bracketed(host),
        port,
        secure=tls is not None,
        creds=None if tls is None else _credentials(tls),
        time_retry=FAILED_ENDPOINT_PAUSE,
        opts=CHANNEL_OPTIONS,
    )


def open_aio_channel(host: str, port: int, tls: TLS | None) -> grpc.aio.Channel:
    """A ``grpc.aio`` channel to ``host:port`` with the same credentials and options as
    ``open_endpoint``'s, for calls awaited on the running event loop."""
    target = netloc(host, port)
    if tls is None:
        return grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS)
    return grpc.aio.secure_channel(target, _credentials(tls), options=CHANNEL_OPTIONS)


def _credentials(tls: TLS) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(
        root_certificates=tls.ca, private_key=tls.key, certificate_chain=tls.cert
    )


def netloc(host: str, port: int) -> str:
    """``host:port`` as pyetcd names an endpoint (an IPv6 host in brackets)."""
    return f"{_bracketed(host)}:{port}"


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host
