"""The Kafka cluster launcher (``consensus_backends.kafka.testkit.cluster``) under ``consensus servers run
kafka --nodes 3``, against real brokers."""

from __future__ import annotations

from pathlib import Path

from cluster_support import FAILOVER, run_under_servers

#: Brokers, a topic with 3 replicas by default, and the brokers as a client sees them through a proxy.
TOPIC = """\
from kafka.admin import KafkaAdminClient, NewTopic
from consensus_testkit.conformance.helpers import wait_until
from consensus_testkit.proxy import ProxyGroup
admin = KafkaAdminClient(bootstrap_servers=cluster.url.split('//')[1].split(','))
assert len(admin.describe_cluster()['brokers']) == 3
admin.create_topics([NewTopic('t', 1, -1)])
def described():  # a broker may answer before the new topic's partitions reach its metadata
    [topic] = admin.describe_topics(['t'])
    return topic if topic['partitions'] else None
topic = wait_until(described, 30, what="topic t has its partition",
                   observe=lambda: admin.describe_topics(['t']))
assert len(topic['partitions'][0]['replica_nodes']) == 3, topic
admin.close()
with ProxyGroup(cluster.fronts) as group:  # through node 1's proxy, every broker is at its proxy
    admin = KafkaAdminClient(bootstrap_servers=group.url_for(cluster.url).split('//')[1])
    ports = sorted(b['port'] for b in admin.describe_cluster()['brokers'])
    admin.close()
    assert len(group.proxies) == 3 and ports == sorted(p.port for p in group.proxies), (ports, group)
"""

#: The group coordinator and the topic's log leader are named, and the latter serves the session.
ROLES = """\
import time
deadline = time.monotonic() + 30  # the first FindCoordinator creates __consumer_offsets
identity = {'members': [['g', 'm']], 'topic': 't'}
while len(roles := cluster.holders(identity)) < 2 and time.monotonic() < deadline:
    time.sleep(0.2)
assert set(roles) == {'coordinator', 'log leader'} and set(roles.values()) <= set(cluster.ids), roles
assert cluster.serving({'members': [], 'topic': 't'}) == roles['log leader']
"""


def test_kafka_cluster_under_servers_run(tmp_path: Path) -> None:
    """``consensus servers run kafka --nodes 3``: the URL names three brokers, all registered; a topic
    gets 3 replicas by default; a client bootstrapping through node 1's proxy is told of every broker
    at its proxy (``ClusterHandle.fronts``); the controller leader is killed, another leads in a
    higher epoch and the node rejoins; the group coordinator and the topic's leader are named and
    the latter serves the session; nothing is left running after."""
    run_under_servers(tmp_path, "kafka", TOPIC + FAILOVER + ROLES, timeout=300)
