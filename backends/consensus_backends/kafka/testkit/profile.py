"""Test profile of the Kafka backend (``consensus_testkit.profile``).

Detection delay: the coordinator expires the member after ``session_timeout``;
the remaining candidates need a heartbeat (``session_timeout / 6``, at most
1 s) to notice the rebalance, a JoinGroup/SyncGroup round and a claim through
the command log. Server-side expiry: LeaveGroup for each of the session's group
members (the admin API's ``remove_group_members``): the broker drops them and
rebalances; the client learns it at its next heartbeat. Restart delay
(``RESTART_DELAY``): what a restarted KRaft node needs beyond a ZooKeeper
server to serve again.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kafka.admin import KafkaAdminClient, MemberToRemove

from consensus_api.config import BackendURL, Secret, Security
from consensus_testkit.profile import TestProfile, moved_to_free_port

DEFAULT_PORT = 9092
#: A KRaft node SIGKILLed and started again serves after its JVM's start (3-5 s on two busy cores), a
#: controller election and its old registration's broker session (docs/guarantees.md): 7-16 s after
#: the kill in all (21.7 s once, beside three other suites), against about 3 s for a ZooKeeper ensemble.
RESTART_DELAY = 20.0


def _expire(url: BackendURL, identity: Mapping[str, Any], timeout: float) -> None:
    """LeaveGroup for the session's members, as the session's user and over its TLS (``identity``)."""
    security: dict[str, Any] = {}
    files = identity.get("tls")
    if files is not None:
        security.update(security_protocol="SSL", ssl_context=Security(tls=True, **files).ssl_context())
    if "sasl_mechanism" in identity:
        security.update(
            security_protocol="SASL_SSL" if files is not None else "SASL_PLAINTEXT",
            sasl_mechanism=identity["sasl_mechanism"],
            sasl_plain_username=url.username,
            sasl_plain_password=Secret(url.password or ""),
        )
    admin = KafkaAdminClient(
        bootstrap_servers=url.host_list(DEFAULT_PORT),
        request_timeout_ms=int(timeout * 1000),
        bootstrap_timeout_ms=int(timeout * 1000),
        **security,
    )
    try:
        for group_id, member_id in identity["members"]:
            admin.remove_group_members(group_id, [MemberToRemove(member_id=member_id)])
    finally:
        admin.close()


KAFKA = TestProfile(
    name="kafka",
    server="kafka",
    detection_delay=lambda session_timeout: min(1.0, session_timeout / 6) + 1.5,
    expire_session=_expire,
    unreachable_url=moved_to_free_port,
    restart_delay=RESTART_DELAY,
    not_applicable={
        "database_file": "a database-file fault (SQLite only)",
        "lists_sessions": "a Kafka session that holds no member or candidate leaves nothing on the brokers "
        "to list (KafkaBackend.live_sessions); a cut-over from Kafka needs --force",
    },
)
