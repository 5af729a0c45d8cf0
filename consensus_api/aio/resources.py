"""Named resources spread over a group from an asyncio session: the twin of ``ResourceHandler``."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import partial

from consensus_api.aio._twin import Twin, immediate
from consensus_api.aio.coordination import AsyncCoordinator, AsyncResourceListener, on_loop_listener
from consensus_api.aio.session import AsyncSession
from consensus_api.assignors import Assignor
from consensus_api.coordinator.handler import check_resource_listener
from consensus_api.coordinator.member import DEFAULT_REBALANCE_TIMEOUT
from consensus_api.coordinator.resources import ResourceHandler


class AsyncResourceHandler(Twin[ResourceHandler]):
    """A ``ResourceHandler`` for asyncio code: the synchronous handler spreads ``resources`` with
    ``assignors`` (same protocols, so members of both kinds share a group), its listener's callbacks
    may be ``async def`` and run on the loop of the session it joined (each awaited at most the
    rebalance timeout). Join with ``await handler.join(session, group)``."""

    def __init__(
        self,
        resources: Iterable[str],
        listener: AsyncResourceListener,
        *,
        assignors: Sequence[str | Assignor] = ("cooperative-sticky",),
    ) -> None:
        check_resource_listener(listener)
        self._listener = on_loop_listener(listener, None, DEFAULT_REBALANCE_TIMEOUT)
        super().__init__(ResourceHandler(resources, self._listener, assignors=assignors))

    @property
    def resources(self) -> frozenset[str]:
        """The resources this member subscribes to."""
        return self._sync.resources

    @property
    def assignors(self) -> list[Assignor]:
        """The assignors, most preferred first."""
        return self._sync.assignors

    @property
    def cooperative(self) -> bool:
        """True when every assignor is cooperative: members keep what they own across rebalances."""
        return self._sync.cooperative

    @property
    def owned(self) -> frozenset[str]:
        """The resources this member owns now."""
        return self._sync.owned

    update_resources = immediate(ResourceHandler.update_resources)

    async def join(
        self,
        session: AsyncSession,
        group: str,
        *,
        rebalance_timeout: float | None = None,
        group_instance_id: str | None = None,
    ) -> AsyncCoordinator:
        """The coordinator of this handler in ``group`` (static with a ``group_instance_id``), like
        ``ResourceHandler.join``; ``await`` its ``ensure_active_group`` to join. The handler's own
        callbacks run on the coordinator's thread, the listener's on ``session``'s loop."""
        loop = session._loop
        self._listener.bind(loop.bridge.loop, rebalance_timeout or DEFAULT_REBALANCE_TIMEOUT)
        create = partial(
            self._sync.join,
            session._sync,
            group,
            rebalance_timeout=rebalance_timeout,
            group_instance_id=group_instance_id,
        )
        return AsyncCoordinator(await loop.bridge.run(create), loop)
