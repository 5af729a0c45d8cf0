"""Shared fixtures: real servers (one each per session, started on first use), kazoo, fresh targets, a
loopback echo server, a local Spark session."""

from __future__ import annotations

import socket
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kazoo.client import KazooClient
from migrate_support import hosts

from consensus_testkit import ServerHandle
from consensus_testkit.host import HOST

pytest_plugins = ["consensus_testkit.fixtures", "zookeeper_support", "kafka_support", "etcd_support"]


@pytest.fixture(scope="module")
def kazoo(zookeeper_server: ServerHandle) -> Iterator[KazooClient]:
    """A plain kazoo client of the session's ZooKeeper server, shared by a module's tests."""
    client = KazooClient(hosts=hosts(zookeeper_server), timeout=30)
    client.start(timeout=30)
    yield client
    client.stop()
    client.close()


@pytest.fixture
def etcd_target(etcd_server: ServerHandle) -> str:
    """An etcd URL whose key prefix no other test uses."""
    return f"{etcd_server.url}/t-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def postgresql_target(postgresql_server: ServerHandle) -> str:
    """A PostgreSQL URL whose table prefix no other test uses."""
    return f"{postgresql_server.url}?table_prefix=m{uuid.uuid4().hex[:8]}_"


@pytest.fixture
def echo_port() -> Iterator[int]:
    """A loopback echo server: every connection gets back what it sends."""
    listener = socket.create_server((HOST, 0))
    listener.settimeout(0.1)
    done = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn:
            while data := conn.recv(4096):
                conn.sendall(data)

    def accept() -> None:
        while not done.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    done.set()
    thread.join(2)
    listener.close()


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    """A local Spark session (two cores) for a module's tests: start-up costs 5-9 s."""
    pytest.importorskip("pyspark")
    from consensus_chaos.check.spark import spark_session  # noqa: PLC0415

    session = spark_session("local[2]")
    yield session
    session.stop()
