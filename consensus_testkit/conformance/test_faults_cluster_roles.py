"""Faults of the nodes holding a session's roles besides the cluster leader (Kafka: the broker
coordinating the session's groups, the leader of its command-log partition).

Marked ``cluster`` and ``session_roles``: they apply to a cluster whose launcher
names those nodes (``ClusterHandle.holders``, from the launcher's ``ClusterLauncher.holders``).
See ``test_faults_cluster.py`` for the sessions' options and the checks every
test ends with (``cluster_support.settled``).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pytest

from consensus_testkit.cluster import SESSION_ROLES
from consensus_testkit.conformance.cluster_support import (
    CLUSTER_OPTIONS,
    ELECTION_BOUND,
    ServerLeaders,
    StaleFence,
    settled,
    wait_write_after,
)
from consensus_testkit.conformance.faults_support import Record, Subject
from consensus_testkit.conformance.helpers import SessionFactory, wait_until

if TYPE_CHECKING:
    from consensus_testkit.cluster import ClusterHandle

pytestmark = [pytest.mark.requires_server, pytest.mark.cluster, pytest.mark.session_roles]


@pytest.mark.parametrize("role", SESSION_ROLES)
def test_session_role_holder_killed(
    role: str,
    consensus_cluster: ClusterHandle,
    consensus_open_session: SessionFactory,
    consensus_ns: str,
    consensus_record: Record,
) -> None:
    """The node holding ``role`` for the session (Kafka ``coordinator``: NOT_COORDINATOR, the group
    coordinator moves; ``log leader``: the command-log partition gets a new leader) is SIGKILLed and
    later restarted: another node takes the role over, writes are acknowledged again, the session is
    never LOST (same member, same leadership), and the common checks hold."""
    subject = Subject(consensus_open_session(**CLUSTER_OPTIONS), consensus_ns)
    fence = StaleFence.taken(subject.session, consensus_ns)
    identity = subject.session._backend.fault_identity()  # the SPI's test-only hook
    holder = wait_until(lambda: consensus_cluster.holders(identity).get(role), 10, what=f"the {role}")
    with ServerLeaders(consensus_cluster) as leaders, subject.probe() as prober:
        killed = prober.fault_begins()
        consensus_cluster.kill(holder)
        moved = wait_until(
            lambda: (n := consensus_cluster.holders(identity).get(role)) != holder and n,
            ELECTION_BOUND,
            what=f"another node as the {role}",
        )
        consensus_record(f"{role} killed -> node {moved} holds it", time.monotonic() - killed)
        consensus_record(f"{role} killed -> first write", wait_write_after(prober, killed, ELECTION_BOUND))
        consensus_cluster.spawn(holder)
        consensus_cluster.wait_ready(ELECTION_BOUND)
        prober.fault_ends()
        settled(subject, prober, leaders, fence, consensus_record)
