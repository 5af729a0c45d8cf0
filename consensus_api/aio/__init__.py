"""consensus-api for asyncio: the same contract as awaitables and async iterators, on every backend.

import asyncio
from consensus_api import aio

async def main() -> None:
    async with aio.connect("sqlite:///app.db") as session:
        await session.storage.put("config/mode", b"fast")
        async for event in session.listeners.watch("config/mode"):
            print(event.value)
            break

asyncio.run(main())

Built on the threaded core (one implementation of the contract): every aio
recipe is the twin of a synchronous one and is built from it (``_twin``), so
each public synchronous method has its aio twin, awaited where it may block.
Blocking calls run on a bounded thread pool per session, events come from the
session's dispatcher thread through ``loop.call_soon_threadsafe``.
"""

from consensus_api.aio._bridge import EventStream
from consensus_api.aio.coordination import (
    AsyncCoordinator,
    AsyncCoordinatorHandler,
    AsyncElection,
    AsyncGroup,
    AsyncIncrementalCoordinator,
    AsyncResourceListener,
    MaybeAwaitable,
)
from consensus_api.aio.lock import AsyncLock
from consensus_api.aio.resources import AsyncResourceHandler
from consensus_api.aio.session import (
    DEFAULT_WORKERS,
    AsyncListeners,
    AsyncSession,
    AsyncStorage,
    Connecting,
    connect,
)

__all__ = [
    "DEFAULT_WORKERS",
    "AsyncCoordinator",
    "AsyncCoordinatorHandler",
    "AsyncElection",
    "AsyncGroup",
    "AsyncIncrementalCoordinator",
    "AsyncListeners",
    "AsyncLock",
    "AsyncResourceHandler",
    "AsyncResourceListener",
    "AsyncSession",
    "AsyncStorage",
    "Connecting",
    "EventStream",
    "MaybeAwaitable",
    "connect",
]
