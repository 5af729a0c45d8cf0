"""The Redis plugin (backends/consensus-redis) against a real redis-server: packaging, the change
stream's gap handling, durability across SIGKILL, server-clock session keys, and bad input.

The contract itself is the conformance suite's (`consensus servers run redis -- consensus
conformance '$CONSENSUS_URL'`); these tests cover what is particular to this backend.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

import consensus_api as ca
from consensus_api import registry
from consensus_api.config import BackendURL
from consensus_redis import RedisBackend
from consensus_redis.layout import Layout
from consensus_testkit import ServerHandle, launcher, server_names, start_server
from consensus_testkit.conformance.helpers import wait_until
from consensus_testkit.profile import profile_for


@pytest.fixture(scope="module")
def server() -> Iterator[ServerHandle]:
    with start_server("redis") as handle:
        yield handle


@pytest.fixture
def prefix() -> str:
    return f"t-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def raw(server: ServerHandle) -> Iterator[redis.Redis]:
    client = redis.Redis(host=server.host, port=server.port, socket_timeout=10)
    yield client
    client.close()


def test_plugin_is_its_own_distribution_found_by_entry_points() -> None:
    """consensus_redis comes from consensus-redis, not from the core wheel, and is found by the
    backend, launcher and tooz entry points; the core's profile lookup resolves it."""
    assert importlib.metadata.packages_distributions()["consensus_redis"] == ["consensus-redis"]
    core_files = importlib.metadata.distribution("consensus-api").files or []
    assert not [f for f in core_files if "consensus_redis" in str(f)]
    assert registry.load_backend("redis") is RedisBackend
    assert "redis" in server_names()
    assert profile_for(BackendURL("redis", (), "/")).server == "redis"
    tooz = {ep.name: ep for ep in importlib.metadata.entry_points(group="tooz.backends")}
    assert tooz["consensus+redis"].dist is not None
    assert tooz["consensus+redis"].dist.name == "consensus-redis"


def test_plugin_launcher_declares_its_secure_variant() -> None:
    """A launcher declares its secure variant (``Launcher.secure``), the plugin's as the built-in ones;
    `consensus servers run NAME --secure` refuses a store without one before starting anything."""
    assert launcher("redis").secure
    assert launcher("postgresql").secure
    refused = subprocess.run(
        [
            sys.executable,
            "-m",
            "consensus_api.cli",
            "servers",
            "run",
            "sqlite",
            "redis",
            "--secure",
            "--",
            "true",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert refused.returncode == 2
    assert "no secure variant of sqlite;" in refused.stderr


def test_bad_urls_fail_before_any_io(tmp_path: Path) -> None:
    """Two hosts, a missing or unusable TLS file are a ConfigurationError at connect, at once (a retry
    until connect_timeout would show), before any connection is tried (the ports named are closed)."""
    started = time.monotonic()
    with pytest.raises(ca.ConfigurationError, match="one standalone server"):
        ca.connect("redis://127.0.0.1:1,127.0.0.1:2/x", connect_timeout=5)
    with pytest.raises(ca.ConfigurationError, match="no such file"):
        ca.connect(f"redis://127.0.0.1:1/x?tls_ca={tmp_path / 'missing.pem'}", connect_timeout=5)
    (tmp_path / "garbage.pem").write_text("not a certificate")
    with pytest.raises(ca.ConfigurationError, match="TLS files"):
        ca.connect(f"redis://127.0.0.1:1/x?tls_ca={tmp_path / 'garbage.pem'}", connect_timeout=5)
    assert time.monotonic() - started < 2


def test_refused_credentials_are_a_configuration_error_without_the_password(server: ServerHandle) -> None:
    secret = f"pw-{uuid.uuid4().hex}"
    with pytest.raises(ca.ConfigurationError) as refused:
        ca.connect(f"redis://someone:{secret}@{server.host}:{server.port}/x", connect_timeout=3)
    assert secret not in str(refused.value)


def test_trimmed_change_entries_are_noticed_and_listeners_converge(
    server: ServerHandle, raw: redis.Redis, prefix: str
) -> None:
    """A change whose stream entry is gone (trimmed before it was read) shows as a jump in the
    entry counter; the reader then re-reads every watched target, so the listener still sees it."""
    layout = Layout.from_path(f"/{prefix}")
    with ca.connect(f"{server.url}{prefix}", session_timeout=3) as session:
        seen: list[bytes | None] = []
        session.listeners.add_value_listener("watched", lambda e: seen.append(e.value))
        version = session.storage.put("watched", b"one")
        wait_until(lambda: seen[-1:] == [b"one"], 10, what="the put")
        # a change that reached the store but whose entry was trimmed: no entry, the counter moved on
        raw.hset(layout.key("kv", "watched"), mapping={"v": b"two", "n": version + 1000})
        raw.incrby(layout.key("seq"), 5)
        session.storage.put("elsewhere", b"x")  # its entry comes after the gap
        wait_until(lambda: seen[-1:] == [b"two"], 10, what="the re-read after the gap")


@pytest.fixture(scope="module")
def secure_server() -> Iterator[ServerHandle]:
    with start_server("redis", secure=True) as handle:
        yield handle


@pytest.mark.parametrize("variant", ["plain", "secure"])
def test_acknowledged_writes_survive_a_server_sigkill(variant: str, request: pytest.FixtureRequest) -> None:
    """appendonly yes + appendfsync always: every acknowledged put is there after kill -9 and restart;
    also with ACL users (Redis 7.0 replays the scripts' effects from the append-only file as the
    default user, so restricting that user would silently drop them: the secure launcher does not)."""
    server: ServerHandle = request.getfixturevalue("server" if variant == "plain" else "secure_server")
    with ca.connect(server.url, session_timeout=5) as session:
        versions = {f"k{i}": session.storage.put(f"k{i}", str(i).encode()) for i in range(100)}
        server.kill()
        server.restart()
        for key, version in versions.items():
            found = session.storage.fetch(key)
            assert found is not None
            assert found.version == version
            assert found.value == key[1:].encode()


def test_session_key_has_the_server_side_ttl(server: ServerHandle, raw: redis.Redis, prefix: str) -> None:
    """The session is a key Redis expires by its own clock: TTL = session_timeout, renewed."""
    with ca.connect(f"{server.url}{prefix}", session_timeout=2) as session:
        identity = session._backend.fault_identity()
        key = Layout(str(identity["prefix"])).key("s", str(identity["session_id"]))
        assert 0 < raw.pttl(key) <= 2000
        wait_until(lambda: raw.pttl(key) > 1900, 5, what="a renewal")
    assert raw.exists(key) == 0  # close drops it at once


def test_ping_reports_the_server_version(server: ServerHandle) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "consensus_api.cli", "ping", server.url, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report["backend"] == "redis"
    assert re.fullmatch(r"\d+\.\d+\.\d+", report["server_version"] or ""), report
