"""The etcd backend's asyncio storage (``grpc.aio``) against a real etcd server: the blocking
calls' results and errors, the fence, 1,000 fetches in flight, and calls cut short by trouble."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
from async_face_support import fences_as_blocking, many_in_flight, same_as_blocking, sealed_as_blocking
from etcd_support import Recorder, open_backend

import consensus_api as ca
from consensus_backends.etcd import EtcdBackend
from consensus_testkit import ServerHandle


@pytest.fixture
def backend(etcd_module_server: ServerHandle, etcd_prefix: str) -> Iterator[EtcdBackend]:
    opened = open_backend(etcd_module_server.url + etcd_prefix, Recorder(), request_timeout=10)
    yield opened
    opened.close()


def test_same_results_and_errors_as_the_blocking_calls(backend: EtcdBackend) -> None:
    asyncio.run(same_as_blocking(backend))


def test_fenced_writes_are_refused_as_the_blocking_ones(backend: EtcdBackend) -> None:
    asyncio.run(fences_as_blocking(backend))


def test_sealed_writes_are_refused_as_the_blocking_ones(backend: EtcdBackend) -> None:
    asyncio.run(sealed_as_blocking(backend))


def test_a_thousand_fetches_in_flight(backend: EtcdBackend) -> None:
    asyncio.run(many_in_flight(backend))


def test_trouble_ends_the_calls_in_flight(etcd_module_server: ServerHandle, etcd_prefix: str) -> None:
    """A paused server: the calls awaiting it end with ``OperationTimeoutError`` once the session
    runs into trouble (its lease keep-alive fails), well before their ``request_timeout``."""
    events = Recorder()
    troubled = open_backend(
        etcd_module_server.url + etcd_prefix, events, session_timeout=3, request_timeout=30
    )

    async def scenario() -> float:
        face = troubled.async_storage()
        assert face is not None
        await face.put("k", b"v", None)
        etcd_module_server.pause()
        try:
            started = time.monotonic()
            outcomes = await asyncio.gather(*(face.fetch("k") for _ in range(10)), return_exceptions=True)
            assert all(isinstance(each, ca.OperationTimeoutError) for each in outcomes), outcomes
            return time.monotonic() - started
        finally:
            etcd_module_server.resume()
            await face.aclose()

    try:
        assert asyncio.run(scenario()) < 15
        assert ca.SessionState.SUSPENDED in events.states.events
    finally:
        troubled.close()
