"""Shared fixtures: real servers (one each per session, started on first use), kazoo, fresh targets."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from kazoo.client import KazooClient
from migrate_support import hosts

from consensus_api.testing import ServerHandle

pytest_plugins = ["consensus_api.testing.pytest_plugin", "zookeeper_support"]


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
