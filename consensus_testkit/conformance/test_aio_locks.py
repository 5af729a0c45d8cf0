"""The ``aio`` section, locks under a fault: an aio holder paused (SIGSTOP) past its session's expiry is
fenced and told, through its streams. The holder is a child process (``aio_lock_worker``), as in the
``locks`` section; the other aio lock tests are in ``test_aio.py``."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator

import pytest

from consensus_api import Versioned
from consensus_testkit.conformance.aio_lock_worker import AioLockWorker
from consensus_testkit.conformance.faults_support import (
    CALL_LIMIT,
    FAULT_OPTIONS,
    SESSION_TIMEOUT,
    Record,
    loss_bound,
)
from consensus_testkit.conformance.helpers import EVENT_TIMEOUT, SessionFactory, unique


@pytest.fixture
def spawn_aio_lock_worker(
    consensus_url: str, consensus_options: dict[str, object]
) -> Iterator[Callable[..., AioLockWorker]]:
    """``spawn_aio_lock_worker(command, *args, **options)`` starts an aio lock worker; all are killed at
    teardown."""
    workers: list[AioLockWorker] = []

    def factory(*args: str, **options: object) -> AioLockWorker:
        worker = AioLockWorker(consensus_url, args, {**consensus_options, **options})
        workers.append(worker)
        return worker

    yield factory
    for worker in workers:
        worker.close()


def test_aio_paused_lock_holder_is_fenced_and_told(
    spawn_aio_lock_worker: Callable[..., AioLockWorker],
    consensus_open_session: SessionFactory,
    consensus_ns: str,
    consensus_record: Record,
) -> None:
    """An aio holder SIGSTOPped until another process took the lock, then resumed: each write it fences
    with its old lease is FencedError, nothing the new holder wrote changes, and its streams tell it:
    ``LockLost`` from ``lock.watch()`` and LOST from ``session.states()``."""
    name, shared, fresh = unique("ct-aio-lock"), f"{consensus_ns}/shared", f"{consensus_ns}/fresh"
    child = spawn_aio_lock_worker("hold", name, **FAULT_OPTIONS)
    _, held = child.expect("HELD", 60)
    old_token = int(held.split()[1])
    session = consensus_open_session(**FAULT_OPTIONS)
    bound = loss_bound(session, SESSION_TIMEOUT)
    child.signal(signal.SIGSTOP)
    try:
        paused = time.monotonic()
        lease = session.lock(name).acquire(timeout=bound + EVENT_TIMEOUT)
        assert lease is not None and lease.token > old_token
        consensus_record("pause -> next holder", time.monotonic() - paused)
        stored = Versioned(b"new holder", session.storage.put(shared, b"new holder", fence=lease))
        mark = len(child.lines)
        for operation, key in (("update", shared), ("delete", shared), ("put", fresh)):
            child.send(f"FENCED {operation} {key}")  # queued: run the moment it resumes
    finally:
        child.signal(signal.SIGCONT)
    index = mark
    for _ in range(3):
        index, line = child.expect("FENCED ", bound, since=index)
        index += 1
        _, operation, outcome, seconds = line.split()
        assert outcome == "fenced", (
            f"a stale aio holder's fenced {operation} ended {outcome}\n{child.stderr_tail()}"
        )
        assert float(seconds) <= CALL_LIMIT, f"a fenced {operation} blocked {seconds}s"
    child.expect(f"LOST {old_token}", bound, since=mark)
    child.expect("STATE LOST", bound, since=mark)
    assert session.storage.fetch(shared) == stored
    assert session.storage.fetch(fresh) is None
