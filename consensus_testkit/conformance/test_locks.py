"""Fenced locks - exclusion, tokens, shared holders, fairness, timeouts, faults.

Contract: <https://consensus-api.github.io/consensus-api/spec/#7a-locks>
"""

from __future__ import annotations

import itertools
import signal
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from consensus_api import (
    FencedError,
    InvalidKeyError,
    InvalidTypeError,
    Lease,
    Lock,
    MemberExistsError,
    NotAMemberError,
    Session,
    Versioned,
)
from consensus_testkit.conformance.faults_support import (
    CALL_LIMIT,
    FAULT_OPTIONS,
    SESSION_TIMEOUT,
    Record,
    loss_bound,
)
from consensus_testkit.conformance.helpers import (
    EVENT_TIMEOUT,
    SessionFactory,
    fires_within,
    stays_quiet,
    unique,
)
from consensus_testkit.conformance.lock_worker import LockWorker

LockWorkerFactory = Callable[..., LockWorker]
#: Between two waiters' arrivals in the fairness tests: each is queued before the next arrives.
ARRIVAL_GAP = 1.0


@pytest.fixture
def spawn_lock_worker(
    consensus_url: str, consensus_options: dict[str, object]
) -> Iterator[LockWorkerFactory]:
    """``spawn_lock_worker(command, *args, **options)`` starts a lock worker; all are killed at teardown."""
    workers: list[LockWorker] = []

    def factory(*args: str, **options: object) -> LockWorker:
        worker = LockWorker(consensus_url, args, {**consensus_options, **options})
        workers.append(worker)
        return worker

    yield factory
    for worker in workers:
        worker.close()


class _Acquirer:
    """``lock.acquire(timeout)`` in a thread; ``result`` once done, with when it returned."""

    def __init__(self, lock: Lock, timeout: float | None = EVENT_TIMEOUT) -> None:
        self.lock = lock
        self.done = threading.Event()
        self.lease: Lease | None = None
        self.error: BaseException | None = None
        self.at = 0.0
        threading.Thread(target=self._run, args=(timeout,), daemon=True).start()

    def _run(self, timeout: float | None) -> None:
        try:
            self.lease = self.lock.acquire(timeout=timeout)
        except BaseException as exc:
            self.error = exc
        self.at = time.monotonic()
        self.done.set()

    def result(self, timeout: float = EVENT_TIMEOUT) -> Lease | None:
        assert self.done.wait(timeout), f"acquire of {self.lock!r} did not return within {timeout}s"
        if self.error is not None:
            raise self.error
        return self.lease


def _held(lock: Lock, timeout: float = EVENT_TIMEOUT) -> Lease:
    lease = lock.acquire(timeout=timeout)
    assert lease is not None, f"{lock!r} not acquired within {timeout}s"
    return lease


def test_exclusive_lock_excludes_until_released(consensus_open_session: SessionFactory) -> None:
    """While one session holds a lock another cannot acquire it; after release it can, with a higher
    token; held and lease follow."""
    name = unique("ct-lock")
    first, second = consensus_open_session().lock(name), consensus_open_session().lock(name)
    lease = _held(first)
    assert first.held and first.lease == lease and (lease.name, lease.shared) == (name, False)
    assert second.acquire(blocking=False) is None
    assert not second.held
    first.release()
    assert not first.held and first.lease is None
    assert _held(second).token > lease.token


def test_tokens_strictly_increase_across_holders(consensus_open_session: SessionFactory) -> None:
    """Tokens strictly increase per lock across holders, also for the same Lock object re-acquiring."""
    name = unique("ct-lock")
    locks = [consensus_open_session().lock(name) for _ in range(3)]
    tokens = []
    for lock in [*locks, locks[0]]:
        tokens.append(_held(lock).token)
        lock.release()
    assert tokens == sorted(set(tokens)), f"tokens did not strictly increase: {tokens}"


def test_waiters_are_served_in_arrival_order(consensus_open_session: SessionFactory) -> None:
    """Three waiters queued one after the other get the lock in that order, each when the previous
    releases."""
    name = unique("ct-lock")
    holder = consensus_open_session().lock(name)
    _held(holder)
    waiters = []
    for _ in range(3):
        waiters.append(_Acquirer(consensus_open_session().lock(name)))
        time.sleep(ARRIVAL_GAP)
    holder.release()
    tokens = []
    for waiter in waiters:
        lease = waiter.result()
        assert lease is not None
        assert not any(
            other.done.is_set() for other in waiters if other is not waiter and other.lease is None
        )
        tokens.append(lease.token)
        waiter.lock.release()
    assert tokens == sorted(tokens), f"served out of arrival order: tokens {tokens}"


def test_shared_holders_exclude_only_exclusive_ones_fairly(consensus_open_session: SessionFactory) -> None:
    """Two shared holders hold at once; an exclusive waiter waits for both; a shared waiter arriving after
    it waits behind it (fairness); tokens increase in that order."""
    name = unique("ct-lock")
    readers = [consensus_open_session().lock(name, shared=True) for _ in range(3)]
    first, second = _held(readers[0]), _held(readers[1])
    assert first.shared and second.shared and first.token < second.token
    writer = _Acquirer(consensus_open_session().lock(name))
    stays_quiet(
        writer.done.is_set, ARRIVAL_GAP, what="an exclusive lock was granted while shared holders held it"
    )
    assert readers[2].acquire(timeout=ARRIVAL_GAP) is None, "a shared waiter overtook a waiting exclusive one"
    late_reader = _Acquirer(readers[2])
    readers[0].release()
    stays_quiet(
        writer.done.is_set, ARRIVAL_GAP, what="an exclusive lock was granted while a shared holder held it"
    )
    readers[1].release()
    fires_within(writer.done.is_set, ARRIVAL_GAP, what="the exclusive waiter is granted at the last release")
    exclusive = writer.result()
    assert exclusive is not None and exclusive.token > second.token
    stays_quiet(
        late_reader.done.is_set,
        ARRIVAL_GAP,
        what="a shared lock was granted while an exclusive holder held it",
    )
    writer.lock.release()
    fires_within(late_reader.done.is_set, ARRIVAL_GAP, what="the shared waiter is granted at the release")
    shared = late_reader.result()
    assert shared is not None and shared.token > exclusive.token


def test_acquire_times_out_and_withdraws(consensus_open_session: SessionFactory) -> None:
    """acquire(timeout=t) returns None after t (within request_timeout more), acquire(blocking=False) at
    once; neither leaves a waiter behind: after release the lock is free for a non-blocking acquire."""
    name = unique("ct-lock")
    session = consensus_open_session()
    holder, waiter = consensus_open_session().lock(name), session.lock(name)
    _held(holder)
    start = time.monotonic()
    assert waiter.acquire(timeout=1.0) is None
    took = time.monotonic() - start
    assert 1.0 <= took <= 1.0 + session.settings.request_timeout, took
    start = time.monotonic()
    assert waiter.acquire(blocking=False) is None
    assert time.monotonic() - start <= session.settings.request_timeout
    holder.release()
    assert waiter.acquire(blocking=False) is not None


def test_fenced_writes_with_a_lease(consensus_open_session: SessionFactory, consensus_ns: str) -> None:
    """A write fenced by the current exclusive lease succeeds; once a later holder took the lock every
    write fenced by the old lease is FencedError and changes nothing."""
    name, key = unique("ct-lock"), f"{consensus_ns}/k"
    old_session, new_session = consensus_open_session(), consensus_open_session()
    old, new = old_session.lock(name), new_session.lock(name)
    stale = _held(old)
    version = old_session.storage.put(key, b"old", fence=stale)
    old.release()
    current = _held(new)
    version = new_session.storage.update(key, b"new", version=version, fence=current)
    for write in (
        lambda: old_session.storage.update(key, b"stale", fence=stale),
        lambda: old_session.storage.delete(key, fence=stale),
        lambda: old_session.storage.put(f"{key}-fresh", b"stale", fence=stale),
    ):
        with pytest.raises(FencedError):
            write()
    assert new_session.storage.fetch(key) == Versioned(b"new", version)
    assert new_session.storage.fetch(f"{key}-fresh") is None


def test_context_manager_and_closed_session(consensus_open_session: SessionFactory) -> None:
    """``with lock`` holds the lease inside and releases on exit; a lock held by a session that closes
    is free at once for the next waiter."""
    name = unique("ct-lock")
    holder_session, other = consensus_open_session(), consensus_open_session()
    with holder_session.lock(name) as lease:
        assert isinstance(lease, Lease)
        assert other.lock(name).acquire(blocking=False) is None
    after = _held(other.lock(name))
    assert after.token > lease.token
    other.lock(name)  # a second Lock object of the same session is another holder
    other.close()
    assert _held(holder_session.lock(name)).token > after.token


def test_bad_input_is_refused_before_io(consensus_session: Session) -> None:
    """Bad names, timeouts, blocking flags, fences and releasing a lock not held are refused before any
    I/O (also on a closed session), as are acquiring twice with one Lock object and fencing with a
    shared lease."""
    name = unique("ct-lock")
    lock, shared = consensus_session.lock(name), consensus_session.lock(name, shared=True)
    _held(lock)
    with pytest.raises(MemberExistsError):
        lock.acquire(blocking=False)
    with pytest.raises(InvalidTypeError):
        consensus_session.storage.put(f"{name}/x", b"", fence=Lease(name, 1, True, "x"))
    lock.release()
    consensus_session.close()
    for bad_name in ("", "a//b", "x" * 1024, "a\x00b"):
        with pytest.raises(InvalidKeyError):
            consensus_session.lock(bad_name)
    with pytest.raises(InvalidTypeError):
        consensus_session.lock(7)  # type: ignore[arg-type]
    with pytest.raises(InvalidTypeError):
        consensus_session.lock(name, shared="yes")  # type: ignore[arg-type]
    for timeout in (-1, -0.5, float("nan")):
        with pytest.raises(InvalidKeyError):
            lock.acquire(timeout=timeout)
    with pytest.raises(InvalidTypeError):
        lock.acquire(timeout="1")  # type: ignore[arg-type]
    with pytest.raises(InvalidTypeError):
        lock.acquire(blocking=None)  # type: ignore[arg-type]
    for never_held in (lock, shared):
        with pytest.raises(NotAMemberError):
            never_held.release()


def test_killed_holder_hands_over(
    spawn_lock_worker: LockWorkerFactory, consensus_open_session: SessionFactory, consensus_record: Record
) -> None:
    """A holder process SIGKILLed: the next waiter gets the lock within session_timeout plus the
    backend's detection delay, with a higher token."""
    name = unique("ct-lock")
    child = spawn_lock_worker("hold", name, **FAULT_OPTIONS)
    _, held = child.expect("HELD", 60)
    session = consensus_open_session(**FAULT_OPTIONS)
    bound = loss_bound(session, SESSION_TIMEOUT)
    waiter = _Acquirer(session.lock(name), bound + EVENT_TIMEOUT)
    time.sleep(ARRIVAL_GAP)
    killed = time.monotonic()
    child.signal(signal.SIGKILL)
    lease = waiter.result(bound + EVENT_TIMEOUT)
    assert lease is not None and lease.token > int(held.split()[1])
    consensus_record("kill -> next holder", waiter.at - killed)
    assert waiter.at - killed <= bound, f"hand-over took {waiter.at - killed:.1f}s, bound {bound:.1f}s"


def test_paused_holder_is_fenced_and_told(
    spawn_lock_worker: LockWorkerFactory,
    consensus_open_session: SessionFactory,
    consensus_ns: str,
    consensus_record: Record,
) -> None:
    """A holder SIGSTOPped until another process took the lock, then resumed: every write it fences with
    its old lease is FencedError (the first ones at once, before it can have noticed anything), nothing
    the new holder wrote changes, and it is told: LockLost and session LOST."""
    name, shared, fresh = unique("ct-lock"), f"{consensus_ns}/shared", f"{consensus_ns}/fresh"
    child = spawn_lock_worker("hold", name, **FAULT_OPTIONS)
    _, held = child.expect("HELD", 60)
    old_token = int(held.split()[1])
    session = consensus_open_session(**FAULT_OPTIONS)
    bound = loss_bound(session, SESSION_TIMEOUT)
    child.signal(signal.SIGSTOP)
    try:
        paused = time.monotonic()
        lease = _held(session.lock(name), bound + EVENT_TIMEOUT)
        consensus_record("pause -> next holder", time.monotonic() - paused)
        assert lease.token > old_token
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
            f"a stale holder's fenced {operation} ended {outcome}\n{child.stderr_tail()}"
        )
        assert float(seconds) <= CALL_LIMIT, f"a fenced {operation} blocked {seconds}s"
    child.expect(f"LOST {old_token}", bound, since=mark)
    child.expect("STATE LOST", bound, since=mark)
    assert session.storage.fetch(shared) == stored
    assert session.storage.fetch(fresh) is None


def test_threads_of_processes_contend_without_overlap(
    spawn_lock_worker: LockWorkerFactory, consensus_session: Session, consensus_ns: str
) -> None:
    """8 threads in each of 3 processes take the lock 3 times each: no two tenures overlap, tokens
    increase in the order of the tenures, and a counter incremented under the lock lost no update."""
    name, key, threads, rounds = unique("ct-lock"), f"{consensus_ns}/counter", 8, 3
    consensus_session.storage.put(key, b"0")
    children = [spawn_lock_worker("contend", name, key, str(threads), str(rounds)) for _ in range(3)]
    for child in children:
        child.expect("READY", 60)
    for child in children:
        child.send("GO")
    for child in children:
        child.expect("DONE", 8 * EVENT_TIMEOUT)
    tenures = sorted(
        (float(start), float(end), int(token))
        for child in children
        for token, start, end in (line.split()[1:] for line in child.lines.events if line.startswith("HELD "))
    )
    assert len(tenures) == 3 * threads * rounds
    for (_, end, token), (start, _, next_token) in itertools.pairwise(tenures):
        assert start >= end, f"two holders overlapped: one until {end}, the next from {start}"
        assert next_token > token, f"tokens went back: {token} then {next_token}"
    counter = consensus_session.storage.fetch(key)
    assert counter is not None and int(counter.value) == len(tenures)
