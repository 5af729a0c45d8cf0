"""Storage over redis-py's asyncio API, for one event loop (``Backend.async_storage``).

The same commands and Lua scripts as the blocking storage (``storage``: its
arguments, the replies' meaning, the seal and fence checks inside each write
script) and the same retries and error translation (``client.connect_failure``,
``client.command_failure``), sent on a ``redis.asyncio`` pool of this loop,
made with the blocking pool's parameters (``RedisClient.parameters``). No
thread is involved; at most ``POOL_SIZE`` connections are open, further calls
wait for one on the loop. Every call ends within ``request_timeout``. A call
cancelled while its command is in flight disconnects its connection (redis-py),
so no later call reads its reply.
"""

from __future__ import annotations

import asyncio
from typing import Any

import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import NoScriptError

from consensus_api.errors import BackendUnavailableError, ConsensusError
from consensus_api.model import Leadership, Versioned
from consensus_redis.client import (
    NETWORK_ERRORS,
    RETRY_PAUSE,
    RedisClient,
    Script,
    command_failure,
    connect_failure,
    script_reply,
)
from consensus_redis.layout import Layout
from consensus_redis.storage import (
    DELETE,
    PUT,
    UPDATE,
    conditioned,
    created,
    fencing,
    key_set,
    versioned,
    written,
)

#: Connections of one asyncio storage: Redis runs one command at a time, so a few keep it busy.
POOL_SIZE = 16


class RedisStorage:
    """``consensus_api.backend.AsyncStorage`` of one ``RedisBackend``, for the running loop; see
    the module docstring. Connects on the first call."""

    def __init__(self, client: RedisClient, layout: Layout) -> None:
        self._client = client
        self._layout = layout
        self._loop = asyncio.get_running_loop()
        connection_class: dict[str, Any] = (
            {"connection_class": redis.asyncio.SSLConnection} if client.tls else {}
        )
        self._pool = redis.asyncio.BlockingConnectionPool(
            **client.parameters,
            retry=Retry(NoBackoff(), 0),
            max_connections=POOL_SIZE,
            timeout=client.request_timeout,
            **connection_class,
        )
        self._closed = False

    async def fetch(self, key: str) -> Versioned | None:
        return versioned(await self._command("HMGET", self._layout.key("kv", key), "v", "n"))

    async def put(self, key: str, value: bytes, fence: Leadership | None) -> int:
        return created(await self._write(PUT, fence, key, value), key)

    async def update(self, key: str, value: bytes, version: int | None, fence: Leadership | None) -> int:
        reply = await self._write(UPDATE, fence, key, value, "" if version is None else version)
        return int(conditioned(reply, key, version)[1])

    async def delete(self, key: str, version: int | None, fence: Leadership | None) -> None:
        conditioned(await self._write(DELETE, fence, key, "" if version is None else version), key, version)

    async def keys(self, namespace: str) -> frozenset[str]:
        return key_set(await self._command("SMEMBERS", self._layout.key("ns", namespace)))

    async def aclose(self) -> None:
        """Disconnect every connection (a call in flight fails). Idempotent."""
        if not self._closed:
            self._closed = True
            await self._pool.disconnect()

    async def _write(self, script: Script, fence: Leadership | None, *args: Any) -> list[Any]:
        deadline = self._loop.time() + self._client.request_timeout
        arguments = (self._layout.prefix, *fencing(fence), *args)
        try:
            reply = await self._command("EVALSHA", script.sha, 0, *arguments, write=True, deadline=deadline)
        except NoScriptError:
            reply = await self._command("EVAL", script.source, 0, *arguments, write=True, deadline=deadline)
        return written(script_reply(reply), fence)

    async def _command(self, *args: Any, write: bool = False, deadline: float | None = None) -> Any:
        """One command, retried and translated as ``RedisClient.command`` does."""
        loop, address = self._loop, self._client.address
        deadline = deadline if deadline is not None else loop.time() + self._client.request_timeout
        while True:
            if self._closed or self._client.closed:  # never reconnect a closed client
                raise BackendUnavailableError(f"the client of redis at {address} is closed")
            sent = False
            try:
                connection = await self._pool.get_connection()  # type: ignore[no-untyped-call]
            except Exception as exc:
                await self._retry_or_raise(exc, connect_failure(exc, address), deadline)
                continue
            try:
                await connection.send_command(*args)
                sent = True
                return await connection.read_response(timeout=max(deadline - loop.time(), 0.01))
            except Exception as exc:
                if isinstance(exc, NETWORK_ERRORS):
                    await connection.disconnect()
                closed = self._closed or self._client.closed
                outcome = command_failure(exc, address, args[0], sent=sent, write=write, closed=closed)
                await self._retry_or_raise(exc, outcome, deadline)
            finally:
                await self._pool.release(connection)

    async def _retry_or_raise(
        self, exc: Exception, outcome: ConsensusError | str | None, deadline: float
    ) -> None:
        """As ``RedisClient._retry_or_raise``, pausing on the loop."""
        if outcome is None:
            raise exc
        if isinstance(outcome, ConsensusError):
            raise outcome from None
        if self._loop.time() + RETRY_PAUSE >= deadline:
            raise BackendUnavailableError(outcome)
        await asyncio.sleep(RETRY_PAUSE)
