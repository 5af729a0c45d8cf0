"""Fixtures and fault tools of the etcd backend's tests (``test_etcd_backend.py``,
``test_etcd_sessions.py``), a pytest plugin of ``conftest.py``: an etcd server per test module (its
tests pause and restart it), a plain client, a key prefix per test, a proxy to cut connections, and
a bare backend whose reports are recorded."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pyetcd
import pytest

import consensus_api as ca
from consensus_api.backend import Target
from consensus_api.config import build_options, parse_url
from consensus_backends.etcd import EtcdBackend
from consensus_testkit import ServerHandle, start_server
from consensus_testkit.conformance.helpers import EventLog
from consensus_testkit.host import HOST
from consensus_testkit.proxy import TcpProxy


@pytest.fixture(scope="module")
def etcd_module_server() -> Iterator[ServerHandle]:
    """One etcd server of the test module: its tests may pause, restart or compact it."""
    with start_server("etcd") as handle:
        yield handle


@pytest.fixture
def etcd_raw(etcd_module_server: ServerHandle) -> Iterator[Any]:
    """A plain pyetcd client, straight to the server."""
    client = pyetcd.MultiEndpointEtcd3Client(
        endpoints=[pyetcd.Endpoint(HOST, etcd_module_server.port, secure=False, time_retry=0.5)], timeout=10
    )
    yield client
    client.close()


@pytest.fixture
def etcd_prefix() -> str:
    """A key prefix no other test uses."""
    return f"/t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def etcd_proxy(etcd_module_server: ServerHandle) -> Iterator[TcpProxy]:
    """A TCP proxy in front of the server: ``drop()`` resets every connection until ``heal()``."""
    with TcpProxy(etcd_module_server.port) as forwarder:
        yield forwarder


class Recorder:
    """BackendEvents that records what a bare backend reports."""

    def __init__(self) -> None:
        self.states: EventLog[ca.SessionState] = EventLog("states")
        self.changes: EventLog[Target] = EventLog("changes")

    def state_changed(self, state: ca.SessionState) -> None:
        self.states(state)

    def changed(self, target: Target) -> None:
        self.changes(target)


def open_backend(url: str, events: Recorder, **options: object) -> EtcdBackend:
    """A bare, opened backend on ``url`` that reports to ``events``."""
    parsed, _ = parse_url(url)
    backend = EtcdBackend(parsed, build_options(options, EtcdBackend.options, "etcd"), events)
    backend.open()
    return backend
