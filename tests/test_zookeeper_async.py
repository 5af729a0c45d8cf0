"""The ZooKeeper backend's asyncio storage (kazoo's asynchronous requests completed on the loop)
against a real server: the blocking calls' results and errors, the fence, 1,000 fetches in flight,
and a call that waits for a connection without blocking the loop."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from async_face_support import fences_as_blocking, many_in_flight, same_as_blocking, sealed_as_blocking
from etcd_support import Recorder

import consensus_api as ca
from consensus_api.config import build_options, parse_url
from consensus_backends.zookeeper.backend import ZooKeeperBackend
from consensus_testkit import ServerHandle


def open_backend(url: str, **options: object) -> ZooKeeperBackend:
    """A bare, opened backend on ``url``."""
    parsed, _ = parse_url(url)
    backend = ZooKeeperBackend(
        parsed, build_options(options, ZooKeeperBackend.options, "zookeeper"), Recorder()
    )
    backend.open()
    return backend


@pytest.fixture
def backend(zk_server: ServerHandle, zk_chroot: str) -> Iterator[ZooKeeperBackend]:
    opened = open_backend(zk_server.url + zk_chroot, request_timeout=10)
    yield opened
    opened.close()


def test_same_results_and_errors_as_the_blocking_calls(backend: ZooKeeperBackend) -> None:
    asyncio.run(same_as_blocking(backend))


def test_fenced_writes_are_refused_as_the_blocking_ones(backend: ZooKeeperBackend) -> None:
    asyncio.run(fences_as_blocking(backend))


def test_sealed_writes_are_refused_as_the_blocking_ones(backend: ZooKeeperBackend) -> None:
    asyncio.run(sealed_as_blocking(backend))


def test_a_thousand_fetches_in_flight(backend: ZooKeeperBackend) -> None:
    asyncio.run(many_in_flight(backend))


def test_a_call_waits_for_the_connection_on_the_loop(zk_own_server: ServerHandle, zk_chroot: str) -> None:
    """While the server is down a fetch waits for the connection without blocking the loop (a
    ticker keeps running), and completes once the server is back."""
    backend = open_backend(zk_own_server.url + zk_chroot, session_timeout=20, request_timeout=20)

    async def scenario() -> tuple[ca.Versioned | None, int]:
        face = backend.async_storage()
        version = await face.put("k", b"v", None)
        zk_own_server.kill()
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.05)
                ticks += 1

        ticking = asyncio.create_task(ticker())
        try:
            fetching = asyncio.create_task(face.fetch("k"))
            await asyncio.sleep(1.0)
            assert not fetching.done()
            await asyncio.to_thread(zk_own_server.restart)
            found = await fetching
        finally:
            ticking.cancel()
            await face.aclose()
        assert found == ca.Versioned(b"v", version)
        return found, ticks

    try:
        _, ticks = asyncio.run(scenario())
    finally:
        backend.close()
    assert ticks >= 10
