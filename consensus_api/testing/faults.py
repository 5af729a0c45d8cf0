"""Server-side faults for tests: end a client's session the way the server itself would.

``expire_session(session)`` asks the session's backend what names it on the
server (``Backend.fault_identity``, a test-only hook), then acts on the
*server* with a client of its own, never on the session's client:

==========  ==============================================================
zookeeper   attach a second client to the session (its id and password) and
            close it: the server expires the session and drops its ephemerals
etcd        ``LeaseRevoke`` of the session's lease: its keys go at once
sqlite,     set the session's lease row to expired (``expires_at = 0``) in
postgresql  the database: the next reaper (any session's heartbeat, every
            ``session_timeout / 3``) drops its members and candidates
kafka       LeaveGroup for each of the session's group members (the admin
            API's ``remove_group_members``): the broker drops them and
            rebalances; the client learns it at its next heartbeat
==========  ==============================================================

The victim then sees what a real expiry looks like: LOST, then CONNECTED with
a new session, re-joining what the application had joined.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Mapping
from typing import Any

from consensus_api.config import BackendURL
from consensus_api.session import Session

Expire = Callable[[BackendURL, Mapping[str, Any], float], None]


def expire_session(session: Session, timeout: float = 10.0) -> Mapping[str, Any]:
    """End ``session``'s current server-side session; returns the identity that was ended.

    Raises ValueError for a backend without server-side sessions or a session
    that has none right now (it is being re-established).
    """
    identity = session._backend.fault_identity()  # the SPI's test-only hook
    try:
        expire = _EXPIRERS[session.backend]
    except KeyError:
        raise ValueError(f"no server-side session expiry for the {session.backend} backend") from None
    if not identity or any(value is None for value in identity.values()):
        raise ValueError(f"the {session.backend} session has no server-side session right now: {identity}")
    expire(session.url, identity, timeout)
    return identity


def _zookeeper(url: BackendURL, identity: Mapping[str, Any], timeout: float) -> None:
    from consensus_api.testing.zookeeper import expire_zookeeper_session  # noqa: PLC0415

    hosts = url.host_list(2181)
    expire_zookeeper_session(hosts, int(identity["session_id"]), bytes.fromhex(identity["password"]), timeout)


def _etcd(url: BackendURL, identity: Mapping[str, Any], timeout: float) -> None:
    import pyetcd  # noqa: PLC0415 - the etcd extra

    endpoints = [pyetcd.Endpoint(e.host, e.port or 2379, secure=False) for e in url.endpoints]
    client = pyetcd.MultiEndpointEtcd3Client(endpoints=endpoints, timeout=timeout, failover=True)
    try:
        if url.username is not None:
            client.authenticate(url.username, url.password or "")
        client.revoke_lease(int(identity["lease"]))
    finally:
        client.close()


def _sql_statement(identity: Mapping[str, Any]) -> tuple[str, str]:
    table = str(identity["sessions_table"])
    if not table.replace("_", "").isalnum():
        raise ValueError(f"unexpected sessions table name {table!r}")
    return f"UPDATE {table} SET expires_at = 0 WHERE id = ", str(identity["session_id"])


def _sqlite(url: BackendURL, identity: Mapping[str, Any], timeout: float) -> None:
    statement, session_id = _sql_statement(identity)
    connection = sqlite3.connect(url.path[1:], timeout=timeout, isolation_level=None)
    try:
        connection.execute(statement + "?", (session_id,))
    finally:
        connection.close()


def _postgresql(url: BackendURL, identity: Mapping[str, Any], timeout: float) -> None:
    import psycopg  # noqa: PLC0415 - the postgresql extra

    statement, session_id = _sql_statement(identity)
    endpoint = url.endpoints[0]
    with psycopg.connect(
        host=endpoint.host,
        port=endpoint.port or 5432,
        user=url.username,
        password=url.password,
        dbname=url.path.lstrip("/") or "postgres",
        connect_timeout=max(1, round(timeout)),
        autocommit=True,
    ) as connection:
        connection.execute((statement + "%s").encode(), (session_id,))


def _kafka(url: BackendURL, identity: Mapping[str, Any], timeout: float) -> None:
    from kafka.admin import KafkaAdminClient, MemberToRemove  # noqa: PLC0415 - the kafka extra

    admin = KafkaAdminClient(
        bootstrap_servers=url.host_list(9092),
        request_timeout_ms=int(timeout * 1000),
        bootstrap_timeout_ms=int(timeout * 1000),
    )
    try:
        for group_id, member_id in identity["members"]:
            admin.remove_group_members(group_id, [MemberToRemove(member_id=member_id)])
    finally:
        admin.close()


_EXPIRERS: dict[str, Expire] = {
    "zookeeper": _zookeeper,
    "etcd": _etcd,
    "sqlite": _sqlite,
    "postgresql": _postgresql,
    "kafka": _kafka,
}
