"""The Kafka backend: storage over a replicated command log, groups on the Kafka group protocol.

Guarantees (see the modules for how):

* Storage is linearizable: writes are decided in log order by every session's
  state machine (:mod:`consensus_backends.kafka.state`); reads first catch up with the
  log's end offset (:mod:`consensus_backends.kafka.commandlog`). Versions and terms are
  log offsets plus one.
* Fenced writes are checked in log order against the service's lease.
* Members and candidates are real Kafka group members
  (:mod:`consensus_backends.kafka.member`); a dead session's members leave within
  ``session_timeout`` plus one heartbeat interval; ``close`` and ``leave``
  send LeaveGroup, so observers see them gone at once.
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
from consensus_api.coordinator.describe import GroupDescription, classic_mode, member
from consensus_api.errors import (
    FencedError,
    KeyExistsError,
    KeyNotFoundError,
    SessionLostError,
    VersionConflictError,
)
from consensus_api.model import Leadership, Versioned
from consensus_backends.kafka import settings as kafka_settings
from consensus_backends.kafka.channel import Channel
from consensus_backends.kafka.commandlog import CommandLog
from consensus_backends.kafka.driver import Driver, Worker
from consensus_backends.kafka.errors import translate, unavailable
from consensus_backends.kafka.groups import Groups
from consensus_backends.kafka.records import Command, Op
from consensus_backends.kafka.state import Outcome, Result, StateMachine

if TYPE_CHECKING:
    from consensus_api.coordinator.engine import CoordinatorEngine, EngineHost


class KafkaBackend(Backend):
    """A session on Kafka: ``kafka://b1:9092,b2:9092/prefix``."""

    options: ClassVar[dict[str, OptionParser]] = dict(kafka_settings.OPTIONS)

    def __init__(self, url: BackendURL, options: Options, events: BackendEvents) -> None:
        super().__init__(url, options, events)
        self._watched: set[Target] = set()
        self._watch_lock = threading.Lock()
        self._closed = False
        self._channel: Channel | None = None
        self._log: CommandLog | None = None
        self._groups: Groups | None = None
        self._driver: Driver | None = None
        self._worker: Worker | None = None
        self._state = StateMachine()
        self._kafka: kafka_settings.Settings | None = None

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
        log_ = CommandLog(settings, channel, self._state, self._on_applied)
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
        driver = Driver(settings, channel, self.events, groups)
        groups.driver = driver
        self._channel, self._log, self._groups = channel, log_, groups
        self._driver, self._worker = driver, worker
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
        """Values and key sets as this session's state machine holds them, without ``sync``'s round
        trip: a change is reported once the reader applied it, and the state machine only moves
        forward, so the re-read sees the change and never less than an earlier read did. Groups
        likewise, from a description requested after the report (``Groups.membership``'s
        ``reread``); elections are read as the backend reads them."""
        return _AppliedState(self._state, self._parts()[1])

    # Storage

    def fetch(self, key: str) -> Versioned | None:
        self._parts()[0].sync(self._deadline())
        return self._state.get(key)

    def keys(self, namespace: str) -> frozenset[str]:
        self._parts()[0].sync(self._deadline())
        return self._state.children(namespace)

    def walk(self, namespace: str) -> Iterator[tuple[str, Versioned]]:
        """The state machine's keys below ``namespace`` once it has caught up with the log's end.

        One snapshot at one log offset, already in memory: no paging is needed.
        """
        self._parts()[0].sync(self._deadline())
        yield from self._state.below(namespace)

    def put(self, key: str, value: bytes, fence: Leadership | None) -> int:
        outcome = self._write(Command(Op.PUT, key, value=value, fence=fence))
        if outcome.result is Result.EXISTS:
            raise KeyExistsError(f"key {key!r} already exists")
        return outcome.number

    def update(self, key: str, value: bytes, version: int | None, fence: Leadership | None) -> int:
        return self._write(Command(Op.UPDATE, key, value=value, version=version, fence=fence)).number

    def delete(self, key: str, version: int | None, fence: Leadership | None) -> None:
        self._write(Command(Op.DELETE, key, version=version, fence=fence))

    def _write(self, command: Command) -> Outcome:
        log_, groups = self._parts()
        if command.fence is not None:
            groups.check_fence(command.fence)
        outcome = log_.command(command, self._deadline())
        key = command.name
        if outcome.result is Result.FENCED:
            fence = command.fence
            assert fence is not None
            raise FencedError(f"the leadership of {fence.service!r} (term {fence.term}) is no longer current")
        if outcome.result is Result.NOT_FOUND:
            raise KeyNotFoundError(f"key {key!r} does not exist")
        if outcome.result is Result.CONFLICT:
            raise VersionConflictError(f"key {key!r} is at version {outcome.number}, not {command.version}")
        return outcome

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
        from consensus_backends.kafka.coordinator import KafkaEngine  # noqa: PLC0415 - loaded on first use

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
        group_id = f"{self._kafka.prefix}.coordinator.{group}"
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

    # Watches

    def watch(self, target: Target) -> None:
        with self._watch_lock:
            self._watched.add(target)
        group_id = self._group_of(target)
        if group_id is not None and self._driver is not None:
            self._driver.watch(group_id, target)

    def unwatch(self, target: Target) -> None:
        with self._watch_lock:
            self._watched.discard(target)
        group_id = self._group_of(target)
        if group_id is not None and self._driver is not None:
            self._driver.unwatch(target)

    def _group_of(self, target: Target) -> str | None:
        if self._kafka is None:
            return None
        if target.kind is TargetKind.GROUP:
            return self._kafka.members_group
        if target.kind is TargetKind.ELECTION:
            return self._kafka.election_id(target.name)
        return None

    def _on_applied(self, targets: list[Target], departed_in: frozenset[str]) -> None:
        """Report the watched targets a command changed, and every watched target read from a
        Kafka group it recorded departures in (what a read of it answers may have changed)."""
        with self._watch_lock:
            touched = [target for target in targets if target in self._watched]
            if departed_in:
                touched += [t for t in self._watched if t not in targets and self._group_of(t) in departed_in]
        for target in touched:
            if self._groups is not None:
                self._groups.reporting(target)
            self.events.changed(target)

    def fault_identity(self) -> dict[str, object]:
        """The session's Kafka group members: ``{"members": [[group id, member id], ...]}``, its command-log
        topic (``"topic"``), and with TLS
        the file options ``tls_ca``, ``tls_cert``, ``tls_key`` (paths) and ``sasl_mechanism`` (tests only)."""
        members = self._groups.members() if self._groups is not None else []
        identity: dict[str, object] = {"members": [[m.group_id, m.kafka_id] for m in members if m.kafka_id]}
        if self._kafka is not None:
            identity["topic"] = self._kafka.topic
        security = self.settings.security
        if security.tls:
            identity["tls"] = {name: getattr(security, name) for name in ("tls_ca", "tls_cert", "tls_key")}
        if self._kafka is not None and "sasl_mechanism" in self._kafka.security:
            identity["sasl_mechanism"] = self._kafka.security["sasl_mechanism"]
        return identity

    # Helpers

    def _parts(self) -> tuple[CommandLog, Groups]:
        if self._log is None or self._groups is None:
            raise SessionLostError("the Kafka backend is not open")
        return self._log, self._groups

    def _deadline(self) -> float:
        return time.monotonic() + self.settings.request_timeout


class _AppliedState:
    """``KafkaBackend.change_reader``: keys from the state machine, groups and elections from ``Groups``."""

    def __init__(self, state: StateMachine, groups: Groups) -> None:
        self._state = state
        self._groups = groups

    def fetch(self, key: str) -> Versioned | None:
        return self._state.get(key)

    def keys(self, namespace: str) -> frozenset[str]:
        return self._state.children(namespace)

    def membership(self, group: str) -> dict[str, bytes]:
        return self._groups.membership(group, reread=True)

    def leadership(self, service: str) -> Leadership | None:
        return self._groups.leadership(service)
