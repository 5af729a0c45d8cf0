"""The tooz driver's URL mapping and registration (its behaviour: tooz's own suite, docs/tooz.md)."""

from __future__ import annotations

import pytest
from oslo_utils import netutils
from stevedore import driver

from consensus_api.tooz_driver import ConsensusDriver
from consensus_api.tooz_driver._plumbing import backend_url


@pytest.mark.parametrize(
    ("tooz_url", "ours"),
    [
        ("consensus+sqlite:////tmp/coord.db", "sqlite:////tmp/coord.db"),
        ("consensus+zookeeper://a:2181,b:2181/app?timeout=5", "zookeeper://a:2181,b:2181/app"),
        (
            "consensus+etcd://127.0.0.1:2379/ns?timeout=5&session_timeout=4",
            "etcd://127.0.0.1:2379/ns?session_timeout=4",
        ),
        ("consensus+postgresql+psycopg://u:p@h/db", "postgresql+psycopg://u:p@h/db"),
    ],
)
def test_backend_url_drops_the_prefix_and_toozs_options(tooz_url: str, ours: str) -> None:
    """The part after ``consensus+`` is our URL; tooz's ``timeout`` is not passed on, ours are."""
    assert backend_url(netutils.urlsplit(tooz_url)) == ours


@pytest.mark.parametrize("scheme", ["sqlite", "postgresql", "zookeeper", "etcd", "kafka"])
def test_registered_in_tooz_backends(scheme: str) -> None:
    """tooz finds the driver for ``consensus+<scheme>`` through its entry point group."""
    found: driver.DriverManager[object] = driver.DriverManager(
        "tooz.backends", f"consensus+{scheme}", invoke_on_load=False
    )
    assert found.driver is ConsensusDriver
