"""The Coordinator on Kafka: the real JoinGroup / SyncGroup / Heartbeat / LeaveGroup protocol.

Each :class:`Coordinator` is one member of the Kafka group
``<prefix>.coordinator.<group>`` with the handler's protocol type and
protocols, so the broker negotiates the protocol (``INCONSISTENT_GROUP_PROTOCOL``
rejects a joiner without disturbing the group), picks the leader and fences
stale generations (``ILLEGAL_GENERATION``, ``UNKNOWN_MEMBER_ID``).

kafka-python runs the group hooks on the member's own IO thread; none of them
runs a handler callback there. They post a request to the coordinator thread
and wait for it without blocking the event loop (``on_join_prepare`` and the
metadata before a JoinGroup), or post and return (``on_join_complete``, a
reset of the generation). ``_perform_assignment`` is synchronous in
kafka-python: the leader's IO thread, which carries only this member's
traffic and has heartbeats paused during a join, waits (at most the rebalance
timeout) for the coordinator thread to run ``perform_assignment``.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import Any

import kafka.errors as kerrors
from kafka.protocol.consumer import UNKNOWN_MEMBER_ID
from kafka.structs import MemberState

from consensus_api.coordinator.engine import CoordinatorEngine, EngineHost, Protocols
from consensus_api.coordinator.handler import Generation
from consensus_api.errors import FencedError, InconsistentGroupProtocolError
from consensus_api.model import SessionState
from consensus_backends.kafka.client import Channel
from consensus_backends.kafka.errors import translate
from consensus_backends.kafka.member import Member, start_member
from consensus_backends.kafka.protocol import Assignment
from consensus_backends.kafka.settings import Settings

log = logging.getLogger("consensus_api.kafka")

TICK = 0.05
IO_POLL = 0.01


@dataclasses.dataclass(eq=False)
class _Request:
    """A hook's request to the coordinator thread."""

    kind: str
    args: tuple[Any, ...]
    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    result: Any = None


class _Inbox:
    """Requests from the IO thread, taken in order by the coordinator thread."""

    def __init__(self, host: EngineHost) -> None:
        self._host = host
        self._lock = threading.Lock()
        self._requests: list[_Request] = []
        self.closed = False

    def post(self, kind: str, *args: Any) -> _Request:
        request = _Request(kind, args)
        with self._lock:
            if self.closed:
                request.done.set()
                return request
            self._requests.append(request)
        self._host.wake()
        return request

    def take(self) -> list[_Request]:
        with self._lock:
            taken, self._requests = self._requests, []
        return taken

    def close(self) -> None:
        with self._lock:
            self.closed = True
            pending, self._requests = self._requests, []
        for request in pending:
            request.done.set()


class _Hooks:
    """What :class:`Member` reports; joins and resets arrive through the overridden hooks instead."""

    def __init__(self, host: EngineHost) -> None:
        self._host = host

    def assigned(self, member: Member, assignment: Assignment | None, sent: frozenset[str]) -> None:
        """Unused: joins complete through ``_on_join_complete_async``."""

    def lost(self, member: Member) -> None:
        """Unused: a reset generation is reported through ``reset_generation``."""

    def wake(self, member: Member) -> None:
        self._host.wake()


class CoordinatorMember(Member):
    """A :class:`Member` whose protocol is the handler's, reached through the coordinator thread."""

    def __init__(
        self,
        settings: Settings,
        api_version: Any,
        group_id: str,
        *,
        protocol_type: str,
        inbox: _Inbox,
        host: EngineHost,
        wait: float,
    ) -> None:
        hooks = _Hooks(host)
        super().__init__(
            settings,
            api_version,
            group_id,
            name=group_id,
            own_id="",
            data=b"",
            hooks=hooks,
            group_instance_id=host.group_instance_id,
        )
        self._type = protocol_type
        self._inbox = inbox
        self._wait = wait
        self.protocols: Protocols = []

    # BaseCoordinator's hooks (IO thread)

    def protocol_type(self) -> str:
        return self._type

    def group_protocols(self) -> list[tuple[str, bytes]]:
        return list(self.protocols)

    async def _on_join_prepare_async(self, generation: int, member_id: str, timeout_ms: Any = None) -> None:
        request = self._inbox.post("prepare", generation, member_id)
        while not request.done.is_set() and not self.stopping:
            await self._manager._net.sleep(IO_POLL)

    def _perform_assignment(self, leader_id: str, protocol: str, members: list[Any]) -> dict[str, bytes]:
        metadata = {m.member_id: bytes(m.metadata) for m in members}
        request = self._inbox.post("assign", leader_id, protocol, metadata)
        request.done.wait(self._wait)
        if request.result is None:
            raise kerrors.RebalanceInProgressError("the assignment is not ready; joining again")
        result: dict[str, bytes] = request.result
        return result

    async def _on_join_complete_async(
        self, generation: int, member_id: str, protocol: str, member_assignment_bytes: bytes
    ) -> None:
        self.completed_at = time.monotonic()
        self._inbox.post("complete", generation, member_id, protocol, bytes(member_assignment_bytes))

    def reset_generation(self, member_id: str = UNKNOWN_MEMBER_ID) -> None:
        super().reset_generation(member_id)
        self._inbox.post("lost")

    async def _send_heartbeat_request(self) -> None:
        try:
            await super()._send_heartbeat_request()
        except kerrors.FencedInstanceIdError as exc:  # kafka-python only stops heartbeating
            self.fatal = exc
            self._hooks.wake(self)
            raise


class KafkaEngine(CoordinatorEngine):
    """A Coordinator's engine on the Kafka group protocol."""

    def __init__(
        self,
        settings: Settings,
        channel: Channel,
        *,
        group: str,
        protocol_type: str,
        host: EngineHost,
        rebalance_timeout: float,
    ) -> None:
        self._settings = dataclasses.replace(settings, rebalance_ms=max(1, round(rebalance_timeout * 1000)))
        self._channel = channel
        self._group_id = settings.layout.coordinator_id(group)
        self._protocol_type = protocol_type
        self._host = host
        self._wait = rebalance_timeout
        self._inbox = _Inbox(host)
        self._member: CoordinatorMember | None = None
        self._joining = False  # from serving a join's "prepare" to serving its "complete"
        self._rejoin_again = False  # a rejoin asked for while that join was under way

    def start(self) -> None:
        deadline = time.monotonic() + self._settings.connect_timeout
        member = start_member(
            lambda: CoordinatorMember(
                self._settings,
                self._channel.api_version,
                self._group_id,
                protocol_type=self._protocol_type,
                inbox=self._inbox,
                host=self._host,
                wait=self._wait,
            ),
            self._channel,
            deadline,
            f"a member of {self._group_id!r}",
        )
        self._member = member

    def step(self) -> float:
        member = self._member
        if member is None:
            return TICK
        for request in self._inbox.take():
            try:
                self._serve(request)
            finally:
                request.done.set()
        member.drive()
        fatal = member.fatal
        if fatal is not None:
            if isinstance(fatal, kerrors.FencedInstanceIdError):
                self._host.lost()
                self._host.fail(
                    FencedError(
                        f"FENCED_INSTANCE_ID: another member of Kafka group {self._group_id!r} started "
                        f"with group_instance_id {self._host.group_instance_id!r}"
                    )
                )
            elif isinstance(fatal, kerrors.InconsistentGroupProtocolError):
                self._host.fail(
                    InconsistentGroupProtocolError(
                        f"Kafka group {self._group_id!r} uses another protocol type or none of this member's"
                    )
                )
            else:
                self._host.fail(translate(fatal, f"joining Kafka group {self._group_id!r}"))
        return TICK

    def _serve(self, request: _Request) -> None:
        member = self._member
        assert member is not None
        if request.kind == "prepare":
            generation, _ = request.args
            if generation < 0:
                self._host.lost()  # kafka-python reset the generation: what we held is gone
            self._joining, self._rejoin_again = True, False  # the metadata is taken after this
            member.protocols = self._host.rejoin()
        elif request.kind == "assign":
            request.result = self._host.assign(*request.args)
        elif request.kind == "complete":
            generation, member_id, protocol, assignment = request.args
            again, self._joining, self._rejoin_again = self._rejoin_again, False, False
            self._host.complete(Generation(generation, member_id, protocol), assignment)
            if again:  # kafka-python cleared rejoin_needed as this join completed
                member.request_rejoin()
        elif request.kind == "lost":
            self._host.lost()

    def session_state(self, state: SessionState) -> None:
        member = self._member
        if state is not SessionState.LOST or member is None:
            return
        self._host.lost()
        old = member.kafka_id
        if old:
            try:
                self._channel.leave(self._group_id, [old], time.monotonic() + self._settings.request_timeout)
            except Exception as exc:
                log.info("could not remove member %s of %s (%s)", old, self._group_id, type(exc).__name__)
        member.reset_generation()

    def close(self, deadline: float) -> None:
        self._inbox.close()
        member = self._member
        if member is not None:
            member.stop(self._channel, deadline)

    def member_id(self) -> str:
        member = self._member
        return member.kafka_id if member is not None else ""

    def rebalancing(self) -> bool:
        member = self._member
        return member is None or member.state is not MemberState.STABLE or bool(member.need_rejoin())

    def request_rejoin(self) -> None:
        """Rejoin; asked while a join is under way (sent with the metadata of before the request),
        once more after it: kafka-python clears ``rejoin_needed`` when that join completes."""
        member = self._member
        if member is not None:
            member.request_rejoin()
            if self._joining:
                self._rejoin_again = True
