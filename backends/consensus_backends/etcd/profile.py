"""Test profile of the etcd backend (``consensus_api.conformance.profile``).

Detection delay: the lease TTL is ``session_timeout`` rounded up to whole
seconds, and the server checks for expired leases every 500 ms. Server-side
expiry: ``LeaseRevoke`` of the session's lease by a client of the test's own:
its keys go at once.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pyetcd

from consensus_api.config import BackendURL
from consensus_api.conformance.profile import TestProfile, moved_to_free_port

DEFAULT_PORT = 2379


def _detection_delay(session_timeout: float) -> float:
    return math.ceil(session_timeout) - session_timeout + 1.0


def _expire(url: BackendURL, identity: Mapping[str, Any], timeout: float) -> None:
    endpoints = [pyetcd.Endpoint(e.host, e.port or DEFAULT_PORT, secure=False) for e in url.endpoints]
    client = pyetcd.MultiEndpointEtcd3Client(endpoints=endpoints, timeout=timeout, failover=True)
    try:
        if url.username is not None:
            client.authenticate(url.username, url.password or "")
        client.revoke_lease(int(identity["lease"]))
    finally:
        client.close()


ETCD = TestProfile(
    name="etcd",
    server="etcd",
    detection_delay=_detection_delay,
    expire_session=_expire,
    unreachable_url=moved_to_free_port,
    not_applicable={"database_file": "a database-file fault (SQLite only)"},
)
