"""Session-scoped pytest fixtures yielding one ready real server each, stopped at session end.

Enable with ``pytest_plugins = ["consensus_testkit.fixtures"]``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from consensus_testkit import ServerHandle, start_cluster, start_server
from consensus_testkit.cluster import ClusterHandle


def _serve(name: str) -> Iterator[ServerHandle]:
    with start_server(name) as server:
        yield server


@pytest.fixture(scope="session")
def postgresql_server() -> Iterator[ServerHandle]:
    """A PostgreSQL server for the whole session."""
    yield from _serve("postgresql")


@pytest.fixture(scope="session")
def mariadb_server() -> Iterator[ServerHandle]:
    """A MariaDB server for the whole session."""
    yield from _serve("mariadb")


@pytest.fixture(scope="session")
def zookeeper_server() -> Iterator[ServerHandle]:
    """A ZooKeeper server for the whole session."""
    yield from _serve("zookeeper")


@pytest.fixture(scope="session")
def etcd_server() -> Iterator[ServerHandle]:
    """An etcd server for the whole session."""
    yield from _serve("etcd")


@pytest.fixture(scope="session")
def kafka_server() -> Iterator[ServerHandle]:
    """A Kafka server for the whole session."""
    yield from _serve("kafka")


@pytest.fixture(scope="session")
def zookeeper_cluster() -> Iterator[ClusterHandle]:
    """A 3-node ZooKeeper ensemble for the whole session (``consensus_testkit.cluster``)."""
    with start_cluster("zookeeper", 3) as cluster:
        yield cluster
