"""Fixtures of the Kafka backend's tests (``test_kafka_backend.py``, ``test_kafka_groups.py``), a pytest
plugin of ``conftest.py``: sessions and session-holding child processes on the session's Kafka broker,
each test under a prefix (so a command-log topic) of its own."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import consensus_api as ca
from consensus_testkit import ServerHandle
from consensus_testkit.conformance.worker import WorkerProcess

SESSION_TIMEOUT = 3.0

Connect = Callable[..., ca.Session]
Holder = Callable[..., WorkerProcess]


@pytest.fixture
def kafka_url(kafka_server: ServerHandle) -> str:
    """A fresh prefix (so a fresh command-log topic) per test."""
    return f"{kafka_server.url}/t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def kafka_connect(kafka_url: str) -> Iterator[Connect]:
    """``kafka_connect(**options)``: a session under this test's prefix; all closed at teardown."""
    sessions: list[ca.Session] = []

    def factory(**options: Any) -> ca.Session:
        session = ca.connect(kafka_url, **{"session_timeout": SESSION_TIMEOUT, **options})
        sessions.append(session)
        return session

    yield factory
    for session in sessions:
        session.close()


@pytest.fixture
def kafka_holder(kafka_url: str) -> Iterator[Holder]:
    """``kafka_holder(group, member, service, candidate)``: a child process whose session joined ``group``
    as ``member`` and nominated ``candidate`` for ``service`` (READY); SIGKILL it to crash; reaped at the
    end."""
    children: list[WorkerProcess] = []

    def factory(group: str, member: str, service: str, candidate: str) -> WorkerProcess:
        args = ["--group", group, "--member", member, "--service", service, "--candidate", candidate]
        children.append(WorkerProcess(kafka_url, "hold", args, {"session_timeout": SESSION_TIMEOUT}))
        children[-1].expect("READY", 60)
        return children[-1]

    yield factory
    for child in children:
        child.close()


def race(*calls: Callable[[], object]) -> list[object]:
    """Run ``calls`` at once, one thread each; their results, or the ``ConsensusError`` each raised."""
    barrier = threading.Barrier(len(calls))
    results: list[object] = [None] * len(calls)

    def run(index: int) -> None:
        barrier.wait()
        try:
            results[index] = calls[index]()
        except ca.ConsensusError as exc:
            results[index] = exc

    threads = [threading.Thread(target=run, args=(index,)) for index in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return results
