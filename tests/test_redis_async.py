"""The Redis backend's asyncio storage (``consensus_redis.aio``) against a real redis-server: the
blocking calls' results and errors (the same scripts), the fence, 1,000 fetches in flight, and a
closed face refusing calls."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import pytest
from async_face_support import fences_as_blocking, many_in_flight, same_as_blocking
from etcd_support import Recorder

import consensus_api as ca
from consensus_api.config import build_options, parse_url
from consensus_redis import RedisBackend
from consensus_testkit import ServerHandle, start_server


@pytest.fixture(scope="module")
def server() -> Iterator[ServerHandle]:
    with start_server("redis") as handle:
        yield handle


@pytest.fixture
def backend(server: ServerHandle) -> Iterator[RedisBackend]:
    parsed, options = parse_url(f"{server.url.rstrip('/')}/t-{uuid.uuid4().hex[:8]}")
    opened = RedisBackend(parsed, build_options(options, RedisBackend.options, "redis", parsed), Recorder())
    opened.open()
    yield opened
    opened.close()


def test_same_results_and_errors_as_the_blocking_calls(backend: RedisBackend) -> None:
    asyncio.run(same_as_blocking(backend))


def test_fenced_writes_are_refused_as_the_blocking_ones(backend: RedisBackend) -> None:
    asyncio.run(fences_as_blocking(backend))


def test_a_thousand_fetches_in_flight(backend: RedisBackend) -> None:
    asyncio.run(many_in_flight(backend))


def test_a_closed_face_refuses_calls(backend: RedisBackend) -> None:
    async def main() -> None:
        face = backend.async_storage()
        assert face is not None
        await face.put("k", b"v", None)
        await face.aclose()
        with pytest.raises(ca.BackendUnavailableError):
            await face.fetch("k")

    asyncio.run(main())


def test_a_sealed_store_refuses_writes_through_the_face(backend: RedisBackend) -> None:
    """The seal is checked inside each write script, so it holds for the face's writes too."""

    async def scenario() -> None:
        face = backend.async_storage()
        assert face is not None
        try:
            version = await face.put("s", b"v", None)
            backend.seal()
            try:
                writes = [
                    face.put("t", b"v", None),
                    face.update("s", b"w", None, None),
                    face.delete("s", None, None),
                ]
                for write in writes:
                    with pytest.raises(ca.SealedError):
                        await write
            finally:
                backend.unseal()
            await face.delete("s", version, None)
        finally:
            await face.aclose()

    asyncio.run(scenario())
