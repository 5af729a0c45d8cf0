"""Fixtures and helpers of the ZooKeeper backend's tests (``test_zookeeper_*.py``), a pytest plugin
of ``conftest.py``: real servers, sessions below a chroot of their own, a plain kazoo client."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kazoo.client import KazooClient

import consensus_api as ca
from consensus_api import Session, SessionState
from consensus_api.floor import FloorBackend
from consensus_backends.zookeeper import ZooKeeperBackend
from consensus_testkit import ServerHandle, start_server
from consensus_testkit.conformance.helpers import EventLog
from consensus_testkit.host import HOST, tcp_request

Connect = Callable[..., Session]


@pytest.fixture(scope="module")
def zk_server() -> Iterator[ServerHandle]:
    """One ZooKeeper server of the test module, for the tests that do not disturb it."""
    with start_server("zookeeper") as handle:
        yield handle


@pytest.fixture
def zk_own_server() -> Iterator[ServerHandle]:
    """A ZooKeeper server for one test that kills, pauses or restarts it."""
    with start_server("zookeeper") as handle:
        yield handle


@pytest.fixture
def zk_chroot() -> str:
    """A chroot no other test uses."""
    return f"/zk-test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def zk_connect(zk_chroot: str) -> Iterator[Connect]:
    """``zk_connect(server, **options)``: a session below this test's chroot; all closed at teardown."""
    sessions: list[Session] = []

    def factory(handle: ServerHandle, **options: Any) -> Session:
        settings = {"session_timeout": 4, "request_timeout": 5, "connect_timeout": 10, **options}
        session = ca.connect(handle.url + zk_chroot, **settings)
        sessions.append(session)
        return session

    yield factory
    for session in sessions:
        session.close()


@pytest.fixture
def zk_raw(zk_server: ServerHandle) -> Iterator[KazooClient]:
    """A plain kazoo client to look at the znodes the backend wrote."""
    client = KazooClient(hosts=f"{HOST}:{zk_server.port}")
    client.start(10)
    yield client
    client.stop()
    client.close()


def backend_of(session: Session) -> ZooKeeperBackend:
    """The ZooKeeper backend of ``session`` (under the floor every session's backend is seen through)."""
    backend = session._backend
    assert isinstance(backend, FloorBackend)
    backend = backend.inner
    assert isinstance(backend, ZooKeeperBackend)
    return backend


def kazoo_of(session: Session) -> KazooClient:
    """The kazoo client of ``session``'s backend."""
    client: KazooClient = backend_of(session)._connection.client
    return client


def zk_session_id(session: Session) -> int:
    """The ZooKeeper session id ``session`` holds now."""
    client_id = kazoo_of(session).client_id
    assert client_id is not None
    return int(client_id[0])


def server_zxid(handle: ServerHandle) -> int:
    """The server's last zxid (its ``srvr`` four-letter word)."""
    match = re.search(rb"Zxid: (0x[0-9a-f]+)", tcp_request(handle.port, b"srvr"))
    assert match is not None
    return int(match.group(1), 16)


def state_log(session: Session) -> EventLog[SessionState]:
    """The session states ``session`` reports from now on."""
    log: EventLog[SessionState] = EventLog("state")
    session.add_state_listener(log)
    return log
