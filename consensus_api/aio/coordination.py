"""Groups, elections and coordinators of an asyncio session."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, TypeVar

from consensus_api.aio._bridge import Bridge, EventStream
from consensus_api.coordinator import (
    Coordinator,
    CoordinatorHandler,
    Generation,
    IncrementalCoordinator,
    ResourceListener,
)
from consensus_api.election import LeaderElection
from consensus_api.membership import GroupMembership
from consensus_api.model import LeaderChanged, Leadership, MembershipChanged

if TYPE_CHECKING:
    from consensus_api.aio.session import AsyncSession

T = TypeVar("T")

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


class AsyncGroup:
    """``GroupMembership`` as awaitables; ``watch()`` streams its membership."""

    def __init__(self, group: GroupMembership, session: AsyncSession) -> None:
        self._group = group
        self._session = session
        self._run = session._bridge.run
        self.name = group.name

    async def join(self, member_id: str, data: bytes = b"") -> None:
        """Join as ``member_id``; a join cancelled in flight is tracked like any other if it
        succeeds (released on ``leave``, close or loss)."""
        await self._run(partial(self._group.join, member_id, data), write="join")

    async def leave(self, member_id: str) -> None:
        """Leave; ``NotAMemberError`` if this session has no member ``member_id``."""
        await self._run(partial(self._group.leave, member_id), write="leave")

    async def members(self) -> frozenset[str]:
        """The ids of the live members."""
        return await self._run(self._group.members)

    async def membership(self) -> dict[str, bytes]:
        """The live members and their data."""
        return await self._run(self._group.membership)

    def watch(self) -> EventStream[MembershipChanged]:
        """The membership now, then after every change (coalesced for a slow consumer)."""
        return self._session._stream(self._group.add_listener, self._group.remove_listener)


class AsyncElection:
    """``LeaderElection`` as awaitables; ``watch()`` streams its leader."""

    def __init__(self, election: LeaderElection, session: AsyncSession) -> None:
        self._election = election
        self._session = session
        self._run = session._bridge.run
        self.service = election.service

    async def nominate(self, candidate_id: str) -> bool:
        """Become a candidate; True if ``candidate_id`` leads now."""
        return await self._run(partial(self._election.nominate, candidate_id), write="nominate")

    async def resign(self, leader_id: str) -> None:
        """Give up leadership or candidacy."""
        await self._run(partial(self._election.resign, leader_id), write="resign")

    async def leader(self) -> str | None:
        """The current leader's id, or None."""
        return await self._run(self._election.leader)

    async def leadership(self) -> Leadership | None:
        """The current leader and its term, or None."""
        return await self._run(self._election.leadership)

    def watch(self) -> EventStream[LeaderChanged]:
        """The leader now, then after every change; ``LeaderChanged(service, None, None)`` (nobody
        leads, or this session's leadership was lost) is never coalesced away."""
        return self._session._stream(
            self._election.add_listener,
            self._election.remove_listener,
            sticky=lambda event: event.leader_id is None,
        )


class AsyncCoordinator:
    """A ``Coordinator`` for asyncio code. ``generation``, ``generation_if_stable``, ``member_id``
    and ``request_rejoin`` only read or signal: they never block and are not awaited."""

    def __init__(self, coordinator: Coordinator, bridge: Bridge) -> None:
        self._coordinator = coordinator
        self._bridge = bridge
        self.group = coordinator.group
        self.generation = coordinator.generation
        self.generation_if_stable = coordinator.generation_if_stable
        self.member_id = coordinator.member_id
        self.request_rejoin = coordinator.request_rejoin

    async def ensure_active_group(self, timeout: float | None = None) -> Generation:
        """Join if needed and wait for a stable generation, like ``Coordinator.ensure_active_group``."""
        return await self._bridge.run(partial(self._coordinator.ensure_active_group, timeout))

    async def close(self, timeout: float | None = None) -> None:
        """Leave the group (``on_leave_prepare`` first). Idempotent."""
        await self._bridge.run(partial(self._coordinator.close, timeout))


class AsyncIncrementalCoordinator:
    """An ``IncrementalCoordinator`` for asyncio code; ``member_id``, ``epoch`` and ``assignment``
    only read: they never block and are not awaited."""

    def __init__(self, coordinator: IncrementalCoordinator, bridge: Bridge) -> None:
        self._coordinator = coordinator
        self._bridge = bridge
        self.group = coordinator.group
        self.member_id = coordinator.member_id
        self.epoch = coordinator.epoch
        self.assignment = coordinator.assignment

    async def ensure_active_group(self, timeout: float | None = None) -> int:
        """Join if needed and wait until the assignment is reconciled; returns the epoch."""
        return await self._bridge.run(partial(self._coordinator.ensure_active_group, timeout))

    async def close(self, timeout: float | None = None) -> None:
        """Revoke everything held and leave. Idempotent."""
        await self._bridge.run(partial(self._coordinator.close, timeout))


class _OnLoop:
    """Callbacks of a coordinator thread run on the event loop, sync or ``async def``; the thread
    waits for each at most ``timeout`` seconds (then the core logs it, as for a callback that raises)."""

    def __init__(self, target: object, bridge: Bridge, timeout: float) -> None:
        self._target = target
        self._bridge = bridge
        self._timeout = timeout

    def call(self, name: str, *args: Any) -> Any:
        callback: Callable[..., Any] = getattr(self._target, name)

        async def invoke() -> Any:
            result = callback(*args)
            return await result if inspect.isawaitable(result) else result

        future = asyncio.run_coroutine_threadsafe(invoke(), self._bridge.loop)
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


class _LoopListener(_OnLoop):
    def on_assigned(self, resources: frozenset[str]) -> None:
        self.call("on_assigned", resources)

    def on_revoked(self, resources: frozenset[str]) -> None:
        self.call("on_revoked", resources)


def on_loop_handler(handler: AsyncCoordinatorHandler, bridge: Bridge, timeout: float) -> CoordinatorHandler:
    """``handler`` (checked by the caller) with every callback run on the loop."""
    return _LoopHandler(handler, bridge, timeout)


def on_loop_listener(listener: AsyncResourceListener, bridge: Bridge, timeout: float) -> ResourceListener:
    """``listener`` (checked by the caller) with both callbacks run on the loop."""
    return _LoopListener(listener, bridge, timeout)
