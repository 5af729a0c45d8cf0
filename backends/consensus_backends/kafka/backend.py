"""The Kafka backend: storage over a replicated command log, groups on the Kafka group protocol.

Guarantees (see the modules for how):

* Storage is linearizable: writes are decided in log order by every session's
  state machine (:mod:`consensus_backends.kafka.state`); reads first catch up with the
  log's end offset (:mod:`consensus_backends.kafka.storage`). Versions and terms are
  log offsets plus one.
* Fenced writes are checked in log order against the service's lease.
* Members and candidates are real Kafka group members
  (:mod:`consensus_backends.kafka.groups`); a dead session's members leave within
  ``session_timeout`` plus one heartbeat interval; ``close`` and ``leave``
  send LeaveGroup, so observers see them gone at once.
* The seal is a command in the log, decided in log order like every write
  (:mod:`consensus_backends.kafka.storage`); terms never exceed the log's end offset.
* Every call returns or raises within ``request_timeout`` (a little more for
  the first contact); only ``ConsensusError`` escapes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, ClassVar

from consensus_api.backend import Backend, BackendEvents, Reader, Target, TargetKind
from consensus_api.config import BackendURL, OptionParser, Options
from consensus_api.coordinator.describe import classic_mode, member
from consensus_api.coordinator.description import GroupDescription
from consensus_api.errors import SessionLostError
from consensus_api.model import Leadership, Versioned
from consensus_backends.kafka import settings as kafka_settings
from consensus_backends.kafka.changes import Changes
from consensus_backends.kafka.client import Channel
from consensus_backends.kafka.commandlog import CommandLog
from consensus_backends.kafka.coordinator import KafkaEngine
from consensus_backends.kafka.errors import translate, unavailable
from consensus_backends.kafka.groups import Groups
from consensus_backends.kafka.lease import Driver, Worker
from consensus_backends.kafka.rereads import ChangeReader
from consensus_backends.kafka.state import StateMachine
from consensus_backends.kafka.storage import Storage

if TYPE_CHECKING:
    from consensus_api.coordinator.engine import CoordinatorEngine, EngineHost


class KafkaBackend(Backend):
    """A session on Kafka: ``kafka://b1:9092,b2:9092/prefix``."""

    options: ClassVar[dict[str, OptionParser]] = dict(kafka_settings.OPTIONS)

    def __init__(self, url: BackendURL, options: Options, events: BackendEvents) -> None:
        super().__init__(url, options, events)
        self._changes = Changes(events, self._group_of)
        self._closed = False
        self._channel: Channel | None = None
        self._log: CommandLog | None = None
        self._storage: Storage | None = None
        self._groups: Groups | None = None
        self._driver: Driver | None = None
        self._worker: Worker | None = None
        self._state = StateMachine()
        self._kafka: kafka_settings.Settings | None = None
        self._ceiling = 0
        self._ceiling_lock = threading.Lock()

    @property
    def name(self) -> str:
        return "kafka"

    def __repr__(self) -> str:
        return f"<KafkaBackend {self.url.redacted()}>"

    def open(self) -> None:
        """Connect, create the command-log topic if absent and start the reader and driver threads."""
        settings = self._kafka = kafka_settings.build(self.url, self.settings)
        deadline = time.monotonic() + settings.connect_timeout
        channel = Channel(settings)
        log_ = CommandLog(settings, channel, self._state, self._changes.applied)
        try:
            channel.open(deadline)
            channel.ensure_topic(deadline)
            log_.open(deadline)
        except Exception as exc:
            log_.close(0.5)
            channel.close()
            raise unavailable(exc, self.url.redacted()) from None
        worker = Worker()
        groups = Groups(settings, channel, log_, self._state, worker=worker, api_version=channel.api_version)
        driver = Driver(settings, channel, self.events, groups, self._changes)
        groups.driver = driver
        self._channel, self._log, self._groups = channel, log_, groups
        self._storage = Storage(log_, self._state, groups, settings.request_timeout)
        self._driver, self._worker = driver, worker
        self._changes.attach(channel, groups)
        driver.start()

    def close(self) -> None:
        """Vacate held leases, leave every group, stop the threads. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._driver is not None:
            self._driver.stop(2.0)
        if self._groups is not None:
            self._groups.close()
        if self._worker is not None:
            self._worker.stop(2.0)
        if self._log is not None:
            self._log.close(1.0)
        if self._channel is not None:
            self._channel.close()

    def change_reader(self) -> Reader:
        """Reads of the state machine as applied, without ``sync``'s round trip (``rereads``)."""
        return ChangeReader(self._state, self._parts()[1])

    # Storage

    def fetch(self, key: str) -> Versioned | None:
        """See ``Storage.fetch``."""
        return self._parts()[0].fetch(key)

    def keys(self, namespace: str) -> frozenset[str]:
        """See ``Storage.keys``."""
        return self._parts()[0].keys(namespace)

    def walk(self, namespace: str) -> Iterator[tuple[str, Versioned]]:
        """See ``Storage.walk``."""
        return self._parts()[0].walk(namespace)

    def put(self, key: str, value: bytes, fence: Leadership | None) -> int:
        """See ``Storage.put``."""
        return self._parts()[0].put(key, value, fence)

    def update(self, key: str, value: bytes, version: int | None, fence: Leadership | None) -> int:
        """See ``Storage.update``."""
        return self._parts()[0].update(key, value, version, fence)

    def delete(self, key: str, version: int | None, fence: Leadership | None) -> None:
        """See ``Storage.delete``."""
        self._parts()[0].delete(key, version, fence)

    # Membership and election

    def join(self, group: str, member_id: str, data: bytes) -> None:
        self._parts()[1].join(group, member_id, data)

    def leave(self, group: str, member_id: str) -> None:
        self._parts()[1].leave(group, member_id)

    def membership(self, group: str) -> dict[str, bytes]:
        return self._parts()[1].membership(group)

    def nominate(self, service: str, candidate_id: str) -> bool:
        return self._parts()[1].nominate(service, candidate_id)

    def resign(self, service: str, candidate_id: str) -> None:
        self._parts()[1].resign(service, candidate_id)

    def leadership(self, service: str) -> Leadership | None:
        return self._parts()[1].leadership(service)

    def coordinator_engine(
        self, group: str, protocol_type: str, host: EngineHost, rebalance_timeout: float
    ) -> CoordinatorEngine | None:
        """The real JoinGroup/SyncGroup protocol (:mod:`consensus_backends.kafka.coordinator`)."""
        if self._kafka is None or self._channel is None:
            raise SessionLostError("the Kafka backend is not open")
        return KafkaEngine(
            self._kafka,
            self._channel,
            group=group,
            protocol_type=protocol_type,
            host=host,
            rebalance_timeout=rebalance_timeout,
        )

    def describe_coordinator_group(self, group: str) -> GroupDescription | None:
        """The broker's view of the Coordinator group (DescribeGroups; no generation id in it)."""
        if self._kafka is None or self._channel is None:
            raise SessionLostError("the Kafka backend is not open")
        group_id = self._kafka.layout.coordinator_id(group)
        deadline = time.monotonic() + self._kafka.request_timeout
        try:
            view = self._channel.describe([group_id], deadline)[group_id]
        except Exception as exc:
            raise translate(exc, f"describing Kafka group {group_id!r}") from None
        protocol = view.protocol or None
        members = tuple(
            member(
                member_id,
                view.protocol_type,
                assignment if protocol else None,
                instance_id=view.instances.get(member_id),
            )
            for member_id, (_, assignment) in sorted(view.members.items())
        )
        mode = classic_mode(view.protocol_type, protocol) if members else "empty"
        return GroupDescription(
            group, mode, view.state.lower(), None, protocol, view.protocol_type or None, members
        )

    # Migration

    def term_ceiling(self) -> int:
        """The command log's end offset (its high watermark), never lower than an earlier answer.

        A term (so a lock token) is the offset of the ``lead`` command that won it plus one, and it is
        issued only once a reader applied that command; readers fetch only below the high
        watermark, so every term issued so far is at most the end offset. One ListOffsets request.
        """
        end = self._parts()[2].end_offset(self._deadline())
        with self._ceiling_lock:
            self._ceiling = max(self._ceiling, end)
            return self._ceiling

    def seal(self) -> None:
        """A ``seal`` command in the log; see :mod:`consensus_backends.kafka.storage` for why every write
        ordered after it, by any session, is refused."""
        self._parts()[0].seal(True)

    def unseal(self) -> None:
        """An ``unseal`` command in the log: writes ordered after it are decided as before the seal."""
        self._parts()[0].seal(False)

    def sealed(self) -> bool:
        """See ``Storage.sealed``."""
        return self._parts()[0].sealed()

    def session_identity(self) -> str:
        """The session id its commands carry in the log (``sid``); the backend keeps it for its life."""
        return self._parts()[2].session_id

    def live_sessions(self) -> frozenset[str] | None:
        """None: Kafka cannot list the live sessions of a store.

        A session that holds no member or candidate leaves nothing on the brokers but its
        connections: its producer and its reader are plain clients, and no Kafka API lists the
        clients connected to a topic. Producer state (DescribeProducers) outlives its producer by
        ``producer.id.expiration.ms`` (a day by default) and is absent until a first write, and
        group members exist only while a session holds members or candidates. Making every
        session a group member would cost each one a JoinGroup at open and heartbeats for its life.
        """
        return None

    # Watches

    def watch(self, target: Target) -> None:
        """See ``Changes.watch``."""
        self._changes.watch(target)

    def unwatch(self, target: Target) -> None:
        """See ``Changes.unwatch``."""
        self._changes.unwatch(target)

    def _group_of(self, target: Target) -> str | None:
        """The Kafka group ``target`` is read from, or None (a value, a key set, or not open)."""
        if self._kafka is None:
            return None
        if target.kind is TargetKind.GROUP:
            return self._kafka.layout.members_group
        if target.kind is TargetKind.ELECTION:
            return self._kafka.layout.election_id(target.name)
        return None

    def fault_identity(self) -> dict[str, object]:
        """The session's Kafka group members: ``{"members": [[group id, member id], ...]}``, its command-log
        topic (``"topic"``), and with TLS
        the file options ``tls_ca``, ``tls_cert``, ``tls_key`` (paths) and ``sasl_mechanism`` (tests only)."""
        members = self._groups.members() if self._groups is not None else []
        identity: dict[str, object] = {"members": [[m.group_id, m.kafka_id] for m in members if m.kafka_id]}
        if self._kafka is not None:
            identity["topic"] = self._kafka.layout.topic
        security = self.settings.security
        if security.tls:
            identity["tls"] = {name: getattr(security, name) for name in ("tls_ca", "tls_cert", "tls_key")}
        if self._kafka is not None and "sasl_mechanism" in self._kafka.security:
            identity["sasl_mechanism"] = self._kafka.security["sasl_mechanism"]
        return identity

    # Helpers

    def _parts(self) -> tuple[Storage, Groups, CommandLog]:
        if self._storage is None or self._groups is None or self._log is None:
            raise SessionLostError("the Kafka backend is not open")
        return self._storage, self._groups, self._log

    def _deadline(self) -> float:
        return time.monotonic() + self.settings.request_timeout
