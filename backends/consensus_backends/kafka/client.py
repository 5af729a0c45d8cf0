"""The backend's own connection to the cluster and the raw requests it sends.

One ``KafkaNetClient`` (with its IO thread) carries every request that is not
a group member's own: topic creation, end offsets (ListOffsets), group
descriptions (DescribeGroups, decoded here because kafka-python's admin
decoder assumes the consumer protocol) and LeaveGroup on behalf of members
whose own connection is gone. Every call is bounded by its deadline; kafka
exceptions propagate for the caller to map.
"""

from __future__ import annotations

import logging
import socket
import ssl
import threading
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import kafka.errors as kerrors
from kafka.net.compat import KafkaNetClient
from kafka.protocol.admin import CreateTopicsRequest, DescribeGroupsRequest, ListGroupsRequest
from kafka.protocol.consumer import LeaveGroupRequest, ListOffsetsRequest
from kafka.protocol.metadata import CoordinatorType, FindCoordinatorRequest, MetadataRequest

from consensus_api.errors import ConfigurationError
from consensus_backends.kafka import login
from consensus_backends.kafka.errors import timeout_error
from consensus_backends.kafka.settings import MAX_RECORD_BYTES, Settings

log = logging.getLogger("consensus_api.kafka")

RETRY_DELAY = 0.05
#: Group states in which DescribeGroups carries member metadata and assignments.
STABLE = "Stable"
PREPARING = "PreparingRebalance"
GONE = ("Empty", "Dead")


@dataclass(frozen=True, slots=True)
class GroupView:
    """One DescribeGroups answer: ``members`` maps member ids to (metadata, assignment);
    ``protocol`` is the chosen protocol (stable groups only), ``instances`` the static members'
    ``group.instance.id``."""

    state: str
    protocol_type: str = ""
    members: dict[str, tuple[bytes, bytes]] = field(default_factory=dict)
    protocol: str = ""
    instances: dict[str, str] = field(default_factory=dict)


class Channel:
    """A bounded, thread-safe request channel to the cluster."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._client = KafkaNetClient(**settings.client())
        self._manager = self._client._manager
        self._coordinators: dict[str, str] = {}
        self._leader: int | None = None
        #: The leader epoch of ``_leader`` as the metadata that named it said (-1: unknown).
        self._epoch = -1
        self._checked = 0  # how many leader checks were sent (round robin over the other brokers)
        self._lock = threading.Lock()
        self._follower: Callable[[], None] = lambda: None  # ``follow_leader``

    def open(self, deadline: float) -> None:
        """Probe a bootstrap broker (TLS and login), start the IO thread and bootstrap; raises a kafka
        error if that fails before ``deadline``, at once for a refused certificate
        (``ConfigurationError``) or login (``SaslAuthenticationFailedError``): kafka-python's
        bootstrap retries both until its deadline."""
        self._probe(deadline)
        self._client._net.start()
        self.run(deadline, self._manager.bootstrap_async, _ms_left(deadline))

    def _probe(self, deadline: float) -> None:
        """With TLS or SASL, one connection to the first reachable bootstrap broker: the TLS handshake
        with the backend's context (``ConfigurationError`` naming why a certificate was refused),
        then the SASL login (:mod:`consensus_backends.kafka.login`). Unreachable brokers, and
        connections lost midway, are left to the bootstrap."""
        security = self._settings.security
        context, sasl = security.get("ssl_context"), login.sasl_enabled(security)
        if context is None and not sasl:
            return
        for address in self._settings.bootstrap.split(","):
            host, _, port = address.rpartition(":")
            name = host.strip("[]")
            try:
                with (
                    socket.create_connection((name, int(port)), timeout=_left(deadline)) as raw,
                    context.wrap_socket(raw, server_hostname=name) if context else raw as sock,
                ):
                    if sasl:
                        login.log_in(sock, name, security, deadline)
                    return
            except ssl.SSLCertVerificationError as exc:
                raise ConfigurationError(
                    f"Kafka at {address}: the server's TLS certificate was refused: {exc.verify_message}"
                ) from None
            except (OSError, kerrors.KafkaConnectionError):
                continue

    @property
    def api_version(self) -> Any:
        """The broker's version, as kafka-python's group coordinator wants it."""
        return self._manager.broker_version

    def close(self) -> None:
        """Close the connections and stop the IO thread."""
        self._client.close()

    def run(self, deadline: float, function: Callable[..., Any], *args: Any) -> Any:
        """Run ``function`` (a coroutine function or one returning a future) on the IO thread."""
        future = self._manager.call_soon(function, *args)
        done = threading.Event()
        future.add_both(lambda _: done.set())
        if not done.wait(max(0.0, deadline - time.monotonic())):
            raise timeout_error("the Kafka request")
        if future.exception is not None:
            raise future.exception
        return future.value

    def start(self, function: Callable[..., Any], *args: Any) -> Any:
        """Start ``function`` on the IO thread; returns a kafka-python ``Future`` at once."""
        return self._manager.call_soon(function, *args)

    def retry(self, deadline: float, function: Callable[..., Any], *args: Any) -> Any:
        """``run`` again after retriable errors until ``deadline``."""
        while True:
            try:
                return self.run(deadline, function, *args)
            except kerrors.RetriableError:
                if time.monotonic() + RETRY_DELAY >= deadline:
                    raise
                time.sleep(RETRY_DELAY)

    # The command-log topic

    def ensure_topic(self, deadline: float) -> None:
        """Create the command-log topic if absent, then wait until its partition has a leader."""
        while self.retry(deadline, self._topic_leader, True) is None:
            if time.monotonic() + 0.1 >= deadline:
                raise timeout_error(f"the topic {self._settings.layout.topic} to get a leader")
            time.sleep(0.1)

    def end_offset(self, deadline: float) -> int:
        """The log's end offset (its high watermark): every acknowledged write lies below it."""
        return int(self.retry(deadline, self._end_offset))

    def _metadata_request(self) -> MetadataRequest:
        topic = MetadataRequest.MetadataRequestTopic(name=self._settings.layout.topic)
        return MetadataRequest(topics=[topic], allow_auto_topic_creation=False)

    async def _topic_leader(self, create: bool) -> int | None:
        topic = self._settings.layout.topic
        response = await self._manager.send(self._metadata_request())
        [described] = [t for t in response.topics if t.name == topic]
        error = kerrors.for_code(described.error_code)
        if error is kerrors.UnknownTopicOrPartitionError and create:
            await self._create_topic(min(3, len(response.brokers)))
            return None
        if error is not kerrors.NoError:
            raise error(f"metadata of topic {topic}")
        leader, epoch = _log_leader(described)
        self._leader, self._epoch = (leader, epoch) if leader >= 0 else (None, -1)
        return self._leader

    async def _create_topic(self, replication: int) -> None:
        topic_type = CreateTopicsRequest.CreatableTopic
        config = {
            "cleanup.policy": "delete",
            "retention.ms": "-1",
            "retention.bytes": "-1",
            "max.message.bytes": str(MAX_RECORD_BYTES),
            "min.insync.replicas": "2" if replication >= 3 else "1",
        }
        request = CreateTopicsRequest(
            topics=[
                topic_type(
                    name=self._settings.layout.topic,
                    num_partitions=1,
                    replication_factor=replication,
                    assignments=[],
                    configs=[topic_type.CreatableTopicConfig(name=k, value=v) for k, v in config.items()],
                )
            ],
            timeout_ms=int(self._settings.request_timeout * 1000),
            validate_only=False,
        )
        response = await self._manager.send(request)
        error = kerrors.for_code(response.topics[0].error_code)
        if error not in (kerrors.NoError, kerrors.TopicAlreadyExistsError):
            raise error(f"creating topic {self._settings.layout.topic}")

    def follow_leader(self, follower: Callable[[], None]) -> None:
        """Call ``follower`` on the IO thread (it must not block) after every probe that succeeded and
        at every change of ``leader_hint``: a long-polling reader so learns of a new leader."""
        self._follower = follower

    def _tell_follower(self) -> None:
        try:
            self._follower()
        except Exception:  # the probe's outcome must not depend on it
            log.warning("following the Kafka command log's leader failed", exc_info=True)

    async def probe(self) -> int:
        """A cheap round trip to the log's leader (its end offset), for liveness."""
        end = await self._end_offset()
        self._tell_follower()
        return end

    def leader_hint(self) -> tuple[int, int] | None:
        """The log's leader and its leader epoch as last learned (by the probe or
        ``leader_deposed``), or None while unknown."""
        leader, epoch = self._leader, self._epoch
        return None if leader is None or epoch < 0 else (leader, epoch)

    async def leader_deposed(self) -> bool:
        """Whether another broker (the next one in turn) names a newer leader of the log, by leader
        epoch, than the one the probe asks: then the probe's broker has been cut off from the quorum
        (it goes on answering as leader) and the newer leader is used from now on. A single-broker
        cluster, an unknown leader or a broker that does not answer tells nothing (False; errors
        propagate to the caller, which ignores them)."""
        leader, epoch = self._leader, self._epoch
        others = sorted(b.node_id for b in self._manager.cluster.brokers() if b.node_id != leader)
        if leader is None or epoch < 0 or not others:
            return False
        self._checked += 1
        response = await self._manager.send(
            self._metadata_request(), node_id=others[self._checked % len(others)]
        )
        named = [
            _log_leader(t)
            for t in response.topics
            if t.name == self._settings.layout.topic and t.error_code == 0
        ]
        newer_leader, newer_epoch = named[0] if named else (-1, -1)
        if newer_leader < 0 or newer_epoch <= epoch or self._leader != leader:
            return False
        self._leader, self._epoch = newer_leader, newer_epoch
        self._tell_follower()
        return True

    async def _end_offset(self) -> int:
        if self._leader is None and await self._topic_leader(False) is None:
            raise kerrors.LeaderNotAvailableError(self._settings.layout.topic)
        topic_type = ListOffsetsRequest.ListOffsetsTopic
        request = ListOffsetsRequest(
            replica_id=-1,
            isolation_level=0,
            topics=[
                topic_type(
                    name=self._settings.layout.topic,
                    partitions=[topic_type.ListOffsetsPartition(partition_index=0, timestamp=-1)],
                )
            ],
        )
        try:
            response = await self._manager.send(request, node_id=self._leader)
        except kerrors.KafkaError:
            self._leader = None
            raise
        [partition] = response.topics[0].partitions
        error = kerrors.for_code(partition.error_code)
        if error is not kerrors.NoError:
            self._leader = None
            raise error("ListOffsets")
        return int(partition.offset)

    # Groups

    def describe(self, group_ids: list[str], deadline: float) -> dict[str, GroupView]:
        """The state and members of each group (``Dead`` for a group that does not exist)."""
        return dict(self.retry(deadline, self.describe_async, list(group_ids)))

    def leave(self, group_id: str, member_ids: list[str], deadline: float) -> None:
        """Remove members from a group (LeaveGroup); members already gone are fine."""
        self.retry(deadline, self._leave, group_id, member_ids)

    async def _coordinator(self, group_id: str) -> str:
        with self._lock:
            known = self._coordinators.get(group_id)
        if known is not None:
            return known
        request = FindCoordinatorRequest(key=group_id, key_type=0, coordinator_keys=[group_id])
        response = await self._manager.send(request)
        result = response.coordinators[0] if response.coordinators else response
        node: str = self._manager.cluster.add_coordinator(result, CoordinatorType.GROUP, group_id)
        log.debug("the coordinator of group %s is node %s", group_id, node)
        with self._lock:
            self._coordinators[group_id] = node
        return node

    def _forget(self, group_id: str) -> None:
        with self._lock:
            self._coordinators.pop(group_id, None)

    async def describe_async(self, group_ids: list[str]) -> dict[str, GroupView]:
        """``describe`` as a coroutine for the IO thread."""
        views: dict[str, GroupView] = {}

        def request(groups: list[str]) -> Any:
            return DescribeGroupsRequest(groups=groups, include_authorized_operations=False)

        async for node, response in self._per_coordinator(group_ids, request):
            for group in response.groups:
                view = views[group.group_id] = self._view(group)
                if log.isEnabledFor(logging.DEBUG):
                    members = sorted(view.members)
                    log.debug(
                        "group %s at node %s: %s, members %s", group.group_id, node, view.state, members
                    )
        return views

    async def rebalancing_async(self, group_ids: list[str]) -> set[str]:
        """Which of ``group_ids`` are preparing a rebalance: one ListGroups filtered by that state
        per coordinator, which carries no member metadata, so its cost does not grow with the
        groups' size (DescribeGroups' does). Needs ListGroups v4 (Kafka 2.6)."""
        wanted, found = set(group_ids), set[str]()
        request = ListGroupsRequest(states_filter=[PREPARING], types_filter=[])
        async for _, response in self._per_coordinator(group_ids, lambda _: request):
            error = kerrors.for_code(response.error_code)
            if error is not kerrors.NoError:
                raise error("listing rebalancing groups")
            found.update(g.group_id for g in response.groups if g.group_id in wanted)
        return found

    async def _per_coordinator(
        self, group_ids: list[str], request: Callable[[list[str]], Any]
    ) -> AsyncIterator[tuple[str, Any]]:
        """Each coordinator of ``group_ids`` and its response to ``request(its groups)``; a failed
        send forgets those groups' coordinator (asked again next time) and raises."""
        by_node: defaultdict[str, list[str]] = defaultdict(list)
        for group_id in group_ids:
            by_node[await self._coordinator(group_id)].append(group_id)
        for node, groups in by_node.items():
            try:
                response = await self._manager.send(request(groups), node_id=node)
            except kerrors.KafkaError:
                for group_id in groups:
                    self._forget(group_id)
                raise
            yield node, response

    def _view(self, group: Any) -> GroupView:
        error = kerrors.for_code(group.error_code)
        if error is kerrors.GroupIdNotFoundError:
            return GroupView("Dead")
        if error is not kerrors.NoError:
            if error in (kerrors.NotCoordinatorError, kerrors.CoordinatorNotAvailableError):
                self._forget(group.group_id)
            raise error(f"describing group {group.group_id}")
        members = {
            m.member_id: (bytes(m.member_metadata or b""), bytes(m.member_assignment or b""))
            for m in group.members
        }
        instances = {m.member_id: m.group_instance_id for m in group.members if m.group_instance_id}
        protocol = group.protocol_data or ""
        return GroupView(group.group_state, group.protocol_type or "", members, protocol, instances)

    async def _leave(self, group_id: str, member_ids: list[str]) -> None:
        identity = LeaveGroupRequest.MemberIdentity
        request = LeaveGroupRequest(
            group_id=group_id,
            member_id=member_ids[0],
            members=[
                identity(member_id=m, group_instance_id=None, reason="consensus-api session ended")
                for m in member_ids
            ],
        )
        try:
            response = await self._manager.send(request, node_id=await self._coordinator(group_id))
        except kerrors.KafkaError:
            self._forget(group_id)
            raise
        error = kerrors.for_code(response.error_code)
        if error in (kerrors.NotCoordinatorError, kerrors.CoordinatorNotAvailableError):
            self._forget(group_id)
        if error not in (kerrors.NoError, kerrors.UnknownMemberIdError, kerrors.GroupIdNotFoundError):
            raise error(f"leaving group {group_id}")


def _ms_left(deadline: float) -> int:
    return max(1, int((deadline - time.monotonic()) * 1000))


def _left(deadline: float) -> float:
    return max(0.01, deadline - time.monotonic())


def _log_leader(described: Any) -> tuple[int, int]:
    """The leader id and leader epoch of the log's one partition in a topic's metadata answer;
    (-1, -1) while it names none."""
    return next(
        ((p.leader_id, p.leader_epoch) for p in described.partitions if p.partition_index == 0), (-1, -1)
    )
