"""Test profile of the Redis backend (``consensus_testkit.profile``).

Detection delay: a dead session's key expires by the server's clock at
``session_timeout``; the next heartbeat of any live session reaps it (every
``session_timeout / 3``, or just after the earliest lease expires), then
listeners read its change entries. Server-side expiry: the session's key is
deleted by a client of the test's own, as its TTL would; the session's own
heartbeat finds it gone within ``session_timeout / 3`` and others' reads of
its groups and elections drop its members and candidates at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import redis

from consensus_api.config import BackendURL
from consensus_redis.client import DEFAULT_PORT
from consensus_redis.layout import Layout
from consensus_testkit.profile import TestProfile, moved_to_free_port


def _detection_delay(session_timeout: float) -> float:
    return session_timeout / 3 + 0.5


def _expire(url: BackendURL, identity: Mapping[str, Any], timeout: float) -> None:
    """Delete the session key (and mark its lease due) with a client of our own, as the session's user
    and over its TLS (``identity``)."""
    layout = Layout(str(identity["prefix"]))
    session_id = str(identity["session_id"])
    endpoint = url.endpoints[0]
    files: Mapping[str, str | None] | None = identity.get("tls")
    tls: dict[str, Any] = {}
    if files is not None:  # the session's own TLS files and checks
        tls = {
            "ssl": True,
            "ssl_ca_certs": files["tls_ca"],
            "ssl_certfile": files["tls_cert"],
            "ssl_keyfile": files["tls_key"],
            "ssl_check_hostname": True,
        }
    client = redis.Redis(
        host=endpoint.host,
        port=endpoint.port or DEFAULT_PORT,
        username=url.username,
        password=url.password,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        **tls,
    )
    try:
        with client.pipeline(transaction=True) as pipe:
            pipe.delete(layout.key("s", session_id))
            pipe.zadd(layout.key("leases"), {session_id: 0})
            pipe.execute()
    finally:
        client.close()


REDIS = TestProfile(
    name="redis",
    server="redis",
    detection_delay=_detection_delay,
    expire_session=_expire,
    unreachable_url=moved_to_free_port,
    not_applicable={"database_file": "a database-file fault (SQLite only)"},
)
