"""Groups, elections and coordinators of an asyncio session: twins of the synchronous ones."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from types import TracebackType
from typing import Any, Protocol, Self, TypeAlias, TypeVar

from consensus_api.aio._bridge import EventStream
from consensus_api.aio._twin import SessionTwin, awaited, immediate
from consensus_api.coordinator import (
    Coordinator,
    CoordinatorHandler,
    IncrementalCoordinator,
)
from consensus_api.coordinator.member import GroupMember
from consensus_api.election import LeaderElection
from consensus_api.errors import ConsensusError
from consensus_api.membership import GroupMembership
from consensus_api.model import LeaderChanged, MembershipChanged

T = TypeVar("T")
M = TypeVar("M", bound=GroupMember)

#: A callback's result: the value itself (plain ``def``) or an awaitable of it (``async def``).
MaybeAwaitable: TypeAlias = T | Awaitable[T]


class AsyncCoordinatorHandler(Protocol):
    """:class:`~consensus_api.coordinator.CoordinatorHandler` for ``AsyncSession.coordinator``:
    each callback may be ``async def`` or plain (every ``CoordinatorHandler`` is one), runs on the
    session's loop in protocol order and is awaited at most the rebalance timeout."""

    def metadata(self) -> MaybeAwaitable[Sequence[tuple[str, bytes]]]:
        """The protocols this member supports, most preferred first, each with its metadata."""
        ...

    def on_join_prepare(self, generation: int, member_id: str) -> MaybeAwaitable[None]:
        """A (re)join starts; ``(-1, "")`` when nothing is held (drop what the member held)."""
        ...

    def perform_assignment(
        self, leader_id: str, protocol: str, members: Mapping[str, bytes]
    ) -> MaybeAwaitable[Mapping[str, bytes]]:
        """On the leader only: the assignment of each member (missing members get ``b""``)."""
        ...

    def on_join_complete(
        self, generation: int, member_id: str, protocol: str, assignment: bytes
    ) -> MaybeAwaitable[None]:
        """The member received ``assignment``; if it raises, it is called again (same arguments)."""
        ...

    def on_leave_prepare(self) -> MaybeAwaitable[None]:
        """The member is about to leave the group (``close``)."""
        ...


class AsyncResourceListener(Protocol):
    """:class:`~consensus_api.coordinator.ResourceListener` for ``AsyncSession.incremental_coordinator``:
    both callbacks may be ``async def`` or plain (every ``ResourceListener`` is one) and run on the
    session's loop, each awaited at most the rebalance timeout."""

    def on_assigned(self, resources: frozenset[str]) -> MaybeAwaitable[None]:
        """This member owns ``resources`` from now on (start them)."""
        ...

    def on_revoked(self, resources: frozenset[str]) -> MaybeAwaitable[None]:
        """This member no longer owns ``resources`` (stop them before returning)."""
        ...


class AsyncGroup(SessionTwin[GroupMembership]):
    """``GroupMembership`` as awaitables; ``watch()`` streams its membership. A join cancelled in
    flight is tracked like any other if it succeeds (released on ``leave``, close or loss)."""

    @property
    def name(self) -> str:
        """The group's name."""
        return self._sync.name

    join = awaited(GroupMembership.join, write="join")
    leave = awaited(GroupMembership.leave, write="leave")
    members = awaited(GroupMembership.members)
    membership = awaited(GroupMembership.membership)

    def watch(self) -> EventStream[MembershipChanged]:
        """The membership now, then after every change (coalesced for a slow consumer)."""
        return self._loop.stream(self._sync.add_listener, self._sync.remove_listener)


class AsyncElection(SessionTwin[LeaderElection]):
    """``LeaderElection`` as awaitables; ``watch()`` streams its leader."""

    @property
    def service(self) -> str:
        """The service this election is for."""
        return self._sync.service

    nominate = awaited(LeaderElection.nominate, write="nominate")
    resign = awaited(LeaderElection.resign, write="resign")
    leader = awaited(LeaderElection.leader)
    leadership = awaited(LeaderElection.leadership)

    def watch(self) -> EventStream[LeaderChanged]:
        """The leader now, then after every change; ``LeaderChanged(service, None, None)`` (nobody
        leads, or this session's leadership was lost) is never coalesced away."""
        return self._loop.stream(
            self._sync.add_listener, self._sync.remove_listener, sticky=lambda event: event.leader_id is None
        )


class _AsyncMember(SessionTwin[M]):
    """What the twins of both coordinators share: the group, ``close`` and ``async with``."""

    @property
    def group(self) -> str:
        """The group's name."""
        return self._sync.group

    @property
    def rebalance_timeout(self) -> float:
        """Seconds a member may take to rejoin during a rebalance."""
        return self._sync.rebalance_timeout

    close = awaited(GroupMember.close)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


class AsyncCoordinator(_AsyncMember[Coordinator]):
    """A ``Coordinator`` for asyncio code. ``generation``, ``generation_if_stable``, ``member_id``,
    ``request_rejoin`` and ``update_metadata`` only read or signal: they never block and are not
    awaited."""

    @property
    def protocol_type(self) -> str:
        """The group's protocol type."""
        return self._sync.protocol_type

    @property
    def group_instance_id(self) -> str | None:
        """This member's static identity (KIP-345), or None."""
        return self._sync.group_instance_id

    ensure_active_group = awaited(Coordinator.ensure_active_group)
    generation = immediate(Coordinator.generation)
    generation_if_stable = immediate(Coordinator.generation_if_stable)
    member_id = immediate(Coordinator.member_id)
    request_rejoin = immediate(Coordinator.request_rejoin)
    update_metadata = immediate(Coordinator.update_metadata)


class AsyncIncrementalCoordinator(_AsyncMember[IncrementalCoordinator]):
    """An ``IncrementalCoordinator`` for asyncio code; ``member_id``, ``epoch``, ``assignment`` and
    ``update_resources`` only read or signal: they never block and are not awaited."""

    @property
    def resources(self) -> frozenset[str]:
        """The resources this member subscribes to."""
        return self._sync.resources

    ensure_active_group = awaited(IncrementalCoordinator.ensure_active_group)
    member_id = immediate(IncrementalCoordinator.member_id)
    epoch = immediate(IncrementalCoordinator.epoch)
    assignment = immediate(IncrementalCoordinator.assignment)
    update_resources = immediate(IncrementalCoordinator.update_resources)


class _OnLoop:
    """Callbacks of a coordinator thread run on an event loop, sync or ``async def``; the thread
    waits for each at most ``timeout`` seconds (then the core logs it, as for a callback that raises)."""

    def __init__(self, target: object, loop: asyncio.AbstractEventLoop | None, timeout: float) -> None:
        self._target = target
        self._event_loop = loop
        self._timeout = timeout

    def bind(self, loop: asyncio.AbstractEventLoop, timeout: float) -> None:
        """Run the callbacks on ``loop`` from now on, each awaited at most ``timeout`` seconds."""
        self._event_loop, self._timeout = loop, timeout

    def call(self, name: str, *args: Any) -> Any:
        loop = self._event_loop
        if loop is None:
            raise ConsensusError(f"{name} was called before its handler joined a group")
        callback: Callable[..., Any] = getattr(self._target, name)

        async def invoke() -> Any:
            result = callback(*args)
            return await result if inspect.isawaitable(result) else result

        future = asyncio.run_coroutine_threadsafe(invoke(), loop)
        try:
            return future.result(self._timeout)
        except TimeoutError:
            future.cancel()
            raise


class _LoopHandler(_OnLoop):
    def metadata(self) -> Sequence[tuple[str, bytes]]:
        result: Sequence[tuple[str, bytes]] = self.call("metadata")
        return result

    def on_join_prepare(self, generation: int, member_id: str) -> None:
        self.call("on_join_prepare", generation, member_id)

    def perform_assignment(
        self, leader_id: str, protocol: str, members: Mapping[str, bytes]
    ) -> Mapping[str, bytes]:
        result: Mapping[str, bytes] = self.call("perform_assignment", leader_id, protocol, members)
        return result

    def on_join_complete(self, generation: int, member_id: str, protocol: str, assignment: bytes) -> None:
        self.call("on_join_complete", generation, member_id, protocol, assignment)

    def on_leave_prepare(self) -> None:
        self.call("on_leave_prepare")


class LoopListener(_OnLoop):
    """A ``ResourceListener`` whose callbacks run on the loop it is bound to (``on_loop_listener``)."""

    def on_assigned(self, resources: frozenset[str]) -> None:
        self.call("on_assigned", resources)

    def on_revoked(self, resources: frozenset[str]) -> None:
        self.call("on_revoked", resources)


def on_loop_handler(
    handler: AsyncCoordinatorHandler, loop: asyncio.AbstractEventLoop, timeout: float
) -> CoordinatorHandler:
    """``handler`` (checked by the caller) with every callback run on ``loop``."""
    return _LoopHandler(handler, loop, timeout)


def on_loop_listener(
    listener: AsyncResourceListener, loop: asyncio.AbstractEventLoop | None, timeout: float
) -> LoopListener:
    """``listener`` (checked by the caller) with both callbacks run on ``loop`` (None: the one it is
    bound to later, ``LoopListener.bind``)."""
    return LoopListener(listener, loop, timeout)
