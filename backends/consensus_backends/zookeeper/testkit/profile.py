"""Test profile of the ZooKeeper backend (``consensus_testkit.profile``).

Detection delay: the server expires sessions on tick boundaries (``tickTime``
500 ms on the test server): up to two ticks. Server-side expiry: a second
client attaches to the session (its id and password) and closes it; the server
then drops the session's ephemeral nodes and the original client sees LOST. On
an ensemble the original client may take the session back (from another node)
before the close lands, which the server then refuses (the session moved): the
second client attaches and closes again until it is told the session expired.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from kazoo.client import KazooClient

from consensus_api.config import BackendURL, Security
from consensus_backends.zookeeper.security import VerifyingHandler
from consensus_testkit.profile import TestProfile, moved_to_free_port

DEFAULT_PORT = 2181


def expire_zookeeper_session(
    hosts: str, session_id: int, password: bytes, timeout: float = 10, tls: Security | None = None
) -> None:
    """Expire the session ``session_id`` on the servers ``hosts`` (``h:p,...``) as a real expiry would;
    over TLS with ``tls``."""
    arguments: dict[str, Any] = {}
    if tls is not None:
        arguments.update(use_ssl=True, handler=VerifyingHandler(tls.ssl_context()))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        client = KazooClient(hosts=hosts, client_id=(session_id, password), **arguments)
        client.start(timeout=max(deadline - time.monotonic(), 1.0))
        try:
            # told the session expired, kazoo opened a new one: the close that expired it landed
            expired = client.client_id is not None and client.client_id[0] != session_id
            client.stop()
        finally:
            client.close()
        if expired:
            return
    raise RuntimeError(f"ZooKeeper session 0x{session_id:x} did not expire within {timeout:g} s")


def _expire(url: BackendURL, identity: Mapping[str, Any], timeout: float) -> None:
    hosts = url.host_list(DEFAULT_PORT)
    files = identity.get("tls")
    tls = Security(tls=True, **files) if files is not None else None
    session_id, password = int(identity["session_id"]), bytes.fromhex(identity["password"])
    expire_zookeeper_session(hosts, session_id, password, timeout, tls)


ZOOKEEPER = TestProfile(
    name="zookeeper",
    server="zookeeper",
    detection_delay=lambda session_timeout: 1.0,
    expire_session=_expire,
    unreachable_url=moved_to_free_port,
    not_applicable={"database_file": "a database-file fault (SQLite only)"},
)
