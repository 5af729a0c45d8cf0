"""The bridged migration on a real pair, ZooKeeper -> etcd: the scenario of test_migration_bridge.py.

Contract: docs/spec.md section 14 and docs/migration.md.
"""

from __future__ import annotations

import uuid

from bridge_support import cut_over_with_a_leader_a_lock_and_a_member

from consensus_testkit import ServerHandle


def test_zookeeper_to_etcd_moves_leader_lock_and_member(
    zookeeper_server: ServerHandle, etcd_target: str
) -> None:
    old = f"{zookeeper_server.url}/bridge-{uuid.uuid4().hex[:8]}"
    cut_over_with_a_leader_a_lock_and_a_member(old, etcd_target, session_timeout=5)
