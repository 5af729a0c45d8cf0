"""Test profile of the etcd backend (``consensus_testkit.profile``).

Detection delay: the lease TTL is ``session_timeout`` rounded up to whole
seconds, and the server checks for expired leases every 500 ms. Server-side
expiry: ``LeaseRevoke`` of the session's lease by a client of the test's own:
its keys go at once.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from consensus_api.config import BackendURL
from consensus_backends.etcd.channel import TLS
from consensus_backends.etcd.client import EtcdClient
from consensus_testkit.profile import TestProfile, moved_to_free_port

#: The TLS file options, in the order of ``TLS``'s fields.
TLS_FILES = ("tls_ca", "tls_cert", "tls_key")

DEFAULT_PORT = 2379


def _detection_delay(session_timeout: float) -> float:
    return math.ceil(session_timeout) - session_timeout + 1.0


def _expire(url: BackendURL, identity: Mapping[str, Any], timeout: float) -> None:
    """Revoke the lease with a client of our own, as the session's user and over its TLS (``identity``)."""
    files = identity.get("tls")
    tls = None
    if files is not None:
        tls = TLS(*(None if files[name] is None else Path(files[name]).read_bytes() for name in TLS_FILES))
    endpoints = [(e.host, e.port or DEFAULT_PORT) for e in url.endpoints]
    client = EtcdClient(endpoints, tls=tls, user=url.username, password=url.password, request_timeout=timeout)
    deadline = time.monotonic() + timeout
    try:
        if url.username is not None:
            client.authenticate(deadline)
        client.revoke(int(identity["lease"]), deadline)
    finally:
        client.close()


ETCD = TestProfile(
    name="etcd",
    server="etcd",
    detection_delay=_detection_delay,
    expire_session=_expire,
    unreachable_url=moved_to_free_port,
    not_applicable={
        "database_file": "a database-file fault (SQLite only)",
    },
)
