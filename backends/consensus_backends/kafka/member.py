"""One group member on the real Kafka group protocol (a ``BaseCoordinator``).

Each candidate, and each session's members of every group together (one
:class:`Slot` each, see :mod:`consensus_backends.kafka.protocol`), are a Kafka
group member with its own connection: a JoinGroup the broker parks during a
rebalance blocks its connection, and must not hold up another member's
heartbeats. The members of one session share one IO thread (a
:class:`Selector` passed as ``net``; a member without one has its own), so a
session costs one thread however many groups it is in. The driver
thread (:mod:`consensus_backends.kafka.lease`) calls :meth:`Member.drive` every tick,
which starts ``ensure_active_group`` on the IO thread when a (re)join is due
and polls the heartbeat; the hooks kafka-python runs on its IO thread only
record state and hand work to the backend through :class:`Hooks`, never block.

A member that the broker drops (``UNKNOWN_MEMBER_ID`` after it had joined) is
*lost*: it never re-joins by itself; the backend reports the session LOST.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import kafka.errors as kerrors
from kafka.coordinator.base import BaseCoordinator
from kafka.net.compat import KafkaNetClient
from kafka.net.selector import NetworkSelector
from kafka.protocol.consumer import UNKNOWN_MEMBER_ID
from kafka.structs import MemberState

from consensus_backends.kafka.client import Channel
from consensus_backends.kafka.errors import translate
from consensus_backends.kafka.loop import Manager, Selector
from consensus_backends.kafka.protocol import (
    ELECTION_TYPE,
    GROUP_TYPE,
    NO_RANK,
    PROTOCOL_NAME,
    Assignment,
    Entry,
    LeaseView,
    Metadata,
    assign,
    decode_assignment,
    encode_metadata,
)
from consensus_backends.kafka.settings import Settings

log = logging.getLogger("consensus_api.kafka")

ENSURE_MS = 1000
_TOKENS = itertools.count(1)


class Slot:
    """One member (or candidate) a :class:`Member` carries, and the outcome its join waits for."""

    def __init__(self, group: str, member_id: str, data: bytes) -> None:
        self.group = group
        self.id = member_id
        self.data = data
        self.token = str(next(_TOKENS))
        self.at = time.time() * 1000
        self.since = -1
        self.settled = threading.Event()
        self.outcome: bool | BaseException = False

    def settle(self, outcome: bool | BaseException) -> None:
        """Record what ``join`` / ``nominate`` waits for (the first outcome only)."""
        if not self.settled.is_set():
            self.outcome = outcome
            self.settled.set()

    def entry(self) -> Entry:
        """The slot as its member's metadata names it."""
        return Entry(self.id, self.token, self.since, self.at, self.data, self.group)


class Hooks(Protocol):
    """What a member reports to its backend; every call returns at once (IO thread)."""

    def assigned(self, member: Member, assignment: Assignment | None, sent: frozenset[str]) -> None:
        """``member`` completed a join with ``assignment``; ``sent``: the tokens of the slots its
        JoinGroup named."""

    def lost(self, member: Member) -> None:
        """The broker dropped ``member``."""

    def wake(self, member: Member) -> None:
        """The driver should drive ``member`` now."""


class Member(BaseCoordinator):  # type: ignore[misc]  # kafka-python is untyped
    """A member (``election=False``) or a candidate (``election=True``) of one Kafka group."""

    def __init__(
        self,
        settings: Settings,
        api_version: Any,
        group_id: str,
        *,
        name: str,
        own_id: str,
        data: bytes,
        hooks: Hooks,
        lease_view: Callable[[], LeaseView] | None = None,
        group_instance_id: str | None = None,
        net: Selector | None = None,
        heartbeat_ms: int | None = None,
    ) -> None:
        configs = settings.client()
        self._own_net = net is None
        selector = NetworkSelector(**configs) if net is None else net
        self.client = KafkaNetClient(net=selector, manager=Manager(selector, **configs), **configs)
        super().__init__(
            self.client,
            group_id=group_id,
            group_instance_id=group_instance_id,
            session_timeout_ms=settings.session_ms,
            heartbeat_interval_ms=heartbeat_ms or settings.heartbeat_ms,
            max_poll_interval_ms=settings.rebalance_ms,
            request_timeout_ms=int(settings.request_timeout * 1000),
            retry_backoff_ms=50,
            api_version=api_version,
        )
        self.name = name
        self.own_id = own_id
        self.election = lease_view is not None
        self.stopping = False
        self.lost = False
        self.fatal: BaseException | None = None
        self.assignment: Assignment | None = None
        self.rejoin_at: float | None = None
        self.completed_at = 0.0
        self._slots_lock = threading.Lock()
        self._slots: dict[tuple[str, str], Slot] = (
            {(name, own_id): Slot(name, own_id, data)} if own_id else {}
        )
        self._sent: frozenset[str] = frozenset()
        self._hooks = hooks
        self._lease_view = lease_view
        self._joined_at = time.time() * 1000
        self._since = -1
        self._ensure: Any = None
        self._heartbeat_dead = False

    def start(self, deadline: float) -> None:
        """Start the member's IO thread (unless it shares one) and bootstrap its connection."""
        if self._own_net:
            self.client._net.start()
        self._manager.bootstrap(max(1, int((deadline - time.monotonic()) * 1000)))

    @property
    def kafka_id(self) -> str:
        """The member id the broker gave this member ('' before the first JoinGroup)."""
        member_id: str = self._generation.member_id
        return member_id

    def overdue(self, limit: float) -> bool:
        """True if the member is joined and its last successful heartbeat is older than ``limit`` s."""
        last = max(self.heartbeat.last_receive, self.heartbeat.last_reset)
        return self.state is MemberState.STABLE and time.monotonic() - last > limit

    @property
    def first(self) -> Slot:
        """The slot the member was created with (a candidate's only one)."""
        return next(iter(self._slots.values()))

    def slot(self, group: str, member_id: str) -> Slot | None:
        """The slot of ``member_id`` in ``group``, if this member carries it."""
        with self._slots_lock:
            return self._slots.get((group, member_id))

    def slots(self) -> list[Slot]:
        """Every slot this member carries."""
        with self._slots_lock:
            return list(self._slots.values())

    def add(self, group: str, member_id: str, data: bytes) -> Slot | None:
        """A new slot for ``member_id`` in ``group``, sent with the next JoinGroup (None if it has
        one)."""
        with self._slots_lock:
            if (group, member_id) in self._slots:
                return None
            slot = self._slots[group, member_id] = Slot(group, member_id, data)
        return slot

    def drop(self, slot: Slot) -> int:
        """Stop carrying ``slot``; how many slots remain."""
        with self._slots_lock:
            if self._slots.get((slot.group, slot.id)) is slot:
                del self._slots[slot.group, slot.id]
            return len(self._slots)

    def drive(self) -> bool:
        """One driver tick: start a (re)join when due, poll the heartbeat. Never blocks. True while
        the member has work under way (a join, or a rejoin it waits for): drive it again next tick;
        otherwise once a second is enough, or when it asks (:meth:`Hooks.wake`)."""
        if self.stopping or self.lost or self.fatal is not None:
            return False
        done = self._ensure
        if done is not None and done.is_done:
            self._ensure = None
            if done.exception is not None and not isinstance(done.exception, kerrors.RetriableError):
                log.warning("joining Kafka group %s failed: %s", self.group_id, type(done.exception).__name__)
                self.fatal = done.exception
                for slot in self.slots():
                    slot.settle(done.exception)
                return False
        if self.rejoin_at is not None and time.monotonic() >= self.rejoin_at:
            self.rejoin_at = None
            self.request_rejoin()
        due = self.need_rejoin() or self.coordinator_unknown() or self._heartbeat_dead
        if self._ensure is None and due:
            self._heartbeat_dead = False
            self._ensure = self._manager.call_soon(self.ensure_active_group_async, ENSURE_MS)
            self._ensure.add_both(lambda _: self._hooks.wake(self))
        try:
            self.poll_heartbeat()
        except Exception as exc:
            log.debug("heartbeat loop of %s ended (%s); restarting", self.group_id, type(exc).__name__)
            self._heartbeat_dead = True
        return self._ensure is not None or self.rejoin_at is not None or self._heartbeat_dead

    def rebalance_seen(self, since: float) -> None:
        """A description sent at ``since`` found the group rebalancing: rejoin now, not at the next
        heartbeat (unless this member already completed a join after ``since``)."""
        if self.state is MemberState.STABLE and self.completed_at < since and not self.stopping:
            self.request_rejoin()

    def stop(self, channel: Channel, deadline: float) -> bool:
        """Leave the group (LeaveGroup on the backend's own connection) and close; True if confirmed.
        A static member (``group_instance_id``) does not leave: the broker keeps its place for the
        session timeout, as KIP-345 has it."""
        self.stopping = True
        try:
            self._close_heartbeat()
        except RuntimeError:  # the client is already closed
            return self.lost
        kafka_id = self.kafka_id
        left = not kafka_id or self.lost or not self.is_dynamic_member()
        try:
            if not left:
                channel.leave(self.group_id, [kafka_id], deadline)
                left = True
        except Exception as exc:
            log.info("could not leave Kafka group %s (%s)", self.group_id, type(exc).__name__)
        finally:
            if self._own_net:
                heartbeat = self._heartbeat_loop_future
                while heartbeat is not None and not heartbeat.is_done and time.monotonic() < deadline:
                    time.sleep(0.01)  # let the closed heartbeat loop end before its IO thread stops
                self.client.close()
            else:  # on the IO thread, which runs on for the other members; the heartbeat loop ends
                self._close_on_io_thread(deadline)
        return left

    def _close_on_io_thread(self, deadline: float) -> None:
        """Close the member's connections on the shared IO thread (waiting at most until
        ``deadline``): their sockets are registered with its selector."""
        closed = threading.Event()
        try:
            future = self._manager.call_soon(self._manager.close)
        except RuntimeError:  # the selector is closed, and the connections with it
            return
        future.add_both(lambda _: closed.set())
        closed.wait(max(0.0, deadline - time.monotonic()))

    # BaseCoordinator's hooks (run on the IO thread)

    def protocol_type(self) -> str:
        return ELECTION_TYPE if self.election else GROUP_TYPE

    def group_protocols(self) -> list[tuple[str, bytes]]:
        last = self.assignment
        with self._slots_lock:
            slots = list(self._slots.values())
            self._sent = frozenset(slot.token for slot in slots)
        metadata = Metadata(
            entries=tuple(slot.entry() for slot in slots),
            at=self._joined_at,
            since=self._since,
            seen=last.generation if last else -1,
            rank=last.rank if last else NO_RANK,
            lease=self._lease_view() if self._lease_view else (0, None),
        )
        return [(PROTOCOL_NAME, encode_metadata(metadata))]

    def _perform_assignment(self, leader_id: str, protocol: str, members: list[Any]) -> dict[str, bytes]:
        own_lease = self._lease_view() if self._lease_view else (0, None)
        return assign(
            self._generation.generation_id,
            [(m.member_id, bytes(m.metadata)) for m in members],
            own_lease,
            election=self.election,
        )

    async def _on_join_complete_async(
        self, generation: int, member_id: str, protocol: str, member_assignment_bytes: bytes
    ) -> None:
        assignment = decode_assignment(bytes(member_assignment_bytes))
        if assignment is not None and assignment.accepted and self._since < 0:
            self._since = assignment.generation
        with self._slots_lock:
            sent = self._sent
            if assignment is not None and assignment.accepted:
                for slot in self._slots.values():
                    if slot.token in sent and slot.since < 0 and slot.token not in assignment.rejected:
                        slot.since = assignment.generation
        self.assignment = assignment
        self.completed_at = time.monotonic()
        self._hooks.assigned(self, assignment, sent)

    def need_rejoin(self) -> bool:
        return not (self.stopping or self.lost) and bool(super().need_rejoin())

    def request_rejoin(self) -> None:
        super().request_rejoin()
        self._hooks.wake(self)

    def coordinator_dead(self, error: Any) -> None:
        super().coordinator_dead(error)
        self._hooks.wake(self)

    def reset_generation(self, member_id: str = UNKNOWN_MEMBER_ID) -> None:
        joined = self._since >= 0
        super().reset_generation(member_id)
        self._hooks.wake(self)
        if member_id == UNKNOWN_MEMBER_ID and joined and not (self.stopping or self.lost):
            self.lost = True
            self._hooks.lost(self)


M = TypeVar("M", bound=Member)


def start_member(create: Callable[[], M], channel: Channel, deadline: float, what: str) -> M:
    """The member ``create`` makes, started (its connection bootstrapped) by ``deadline``; stopped
    again if starting fails. Failures become consensus_api errors naming ``what``."""
    try:
        member = create()
    except Exception as exc:
        raise translate(exc, f"creating {what}") from None
    try:
        member.start(deadline)
    except Exception as exc:
        member.stop(channel, deadline)
        raise translate(exc, f"connecting {what}") from None
    return member
