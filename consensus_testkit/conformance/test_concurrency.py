"""Concurrency: racing creates and CAS loops from threads and processes.

Contract: sections 4, 6, 7 of <https://consensus-api.github.io/consensus-api/spec/>
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from consensus_api import KeyExistsError, MemberExistsError, Session, VersionConflictError
from consensus_testkit.conformance.helpers import EVENT_TIMEOUT, SessionFactory, unique
from consensus_testkit.conformance.plugin import WorkerFactory
from consensus_testkit.conformance.worker import WorkerProcess

T = TypeVar("T")

#: Bound on a whole race or counter run.
RUN_TIMEOUT = 120.0


def _race(sessions: list[Session], action: Callable[[Session, int], T]) -> list[T | BaseException]:
    """Run ``action(session, index)`` for every session at once (a barrier releases them together)."""
    barrier = threading.Barrier(len(sessions), timeout=EVENT_TIMEOUT)

    def run(index: int) -> T | BaseException:
        barrier.wait()
        try:
            return action(sessions[index], index)
        except Exception as exc:
            return exc

    with ThreadPoolExecutor(len(sessions), thread_name_prefix="ct-race") as pool:
        futures = [pool.submit(run, index) for index in range(len(sessions))]
        return [future.result(RUN_TIMEOUT) for future in futures]


def _increment(session: Session, key: str, times: int) -> int:
    """Increment the decimal counter at ``key`` ``times`` times by compare-and-set; returns the conflicts."""
    conflicts = 0
    for _ in range(times):
        while True:
            current = session.storage.fetch(key)
            assert current is not None
            try:
                session.storage.update(key, str(int(current.value) + 1).encode(), version=current.version)
                break
            except VersionConflictError:
                conflicts += 1
                assert conflicts < 10_000, "no progress in the compare-and-set loop"
    return conflicts


def _start_all(workers: list[WorkerProcess]) -> None:
    for worker in workers:
        worker.expect("READY", 60)
    for worker in workers:
        worker.send("GO")


def test_racing_put_from_threads_has_one_winner(
    consensus_open_session: SessionFactory, consensus_ns: str
) -> None:
    """8 threads with 8 sessions put one key at once: exactly one wins, the others get KeyExistsError."""
    key = f"{consensus_ns}/race"
    sessions = [consensus_open_session() for _ in range(8)]
    results = _race(sessions, lambda each, index: each.storage.put(key, str(index).encode()))
    winners = [index for index, result in enumerate(results) if isinstance(result, int)]
    losers = [result for result in results if isinstance(result, KeyExistsError)]
    assert len(winners) == 1 and len(losers) == 7, results
    stored = sessions[0].storage.fetch(key)
    assert stored is not None and stored.value == str(winners[0]).encode()
    assert stored.version == results[winners[0]]


def test_one_session_shared_by_threads(consensus_session: Session, consensus_ns: str) -> None:
    """8 threads sharing one session put distinct keys at once; every put succeeds."""
    results = _race(
        [consensus_session] * 8, lambda each, index: each.storage.put(f"{consensus_ns}/k{index}", b"v")
    )
    assert all(isinstance(result, int) for result in results), results
    assert consensus_session.storage.keys(consensus_ns) == {f"{consensus_ns}/k{index}" for index in range(8)}


def test_racing_put_from_processes_has_one_winner(
    consensus_open_session: SessionFactory, consensus_spawn_worker: WorkerFactory, consensus_ns: str
) -> None:
    """4 processes put one key at once: exactly one wins, the others get KeyExistsError."""
    key = f"{consensus_ns}/race"
    workers = [consensus_spawn_worker("put", key) for _ in range(4)]
    _start_all(workers)
    results = [worker.expect("RESULT", RUN_TIMEOUT)[1] for worker in workers]
    winners = [each for each, result in zip(workers, results, strict=True) if result.startswith("RESULT won")]
    assert len(winners) == 1, results
    assert sum(result == "RESULT exists" for result in results) == 3, results
    stored = consensus_open_session().storage.fetch(key)
    assert stored is not None and stored.value == str(winners[0].pid).encode()


def test_cas_increments_from_threads_lose_no_update(
    consensus_open_session: SessionFactory, consensus_ns: str
) -> None:
    """4 threads (two sessions each shared by two) do 25 CAS increments each: the counter ends at 100."""
    key = f"{consensus_ns}/counter"
    first, second = consensus_open_session(), consensus_open_session()
    first.storage.put(key, b"0")
    results = _race([first, first, second, second], lambda each, _: _increment(each, key, 25))
    assert all(isinstance(result, int) for result in results), results
    stored = second.storage.fetch(key)
    assert stored is not None and int(stored.value) == 100


def test_cas_increments_from_processes_lose_no_update(
    consensus_open_session: SessionFactory, consensus_spawn_worker: WorkerFactory, consensus_ns: str
) -> None:
    """3 processes do 15 CAS increments each on one counter: it ends at 45."""
    key = f"{consensus_ns}/counter"
    session = consensus_open_session()
    session.storage.put(key, b"0")
    workers = [consensus_spawn_worker("cas", key, "15") for _ in range(3)]
    _start_all(workers)
    results = [worker.expect("RESULT", RUN_TIMEOUT)[1] for worker in workers]
    assert all(result.startswith("RESULT done") for result in results), results
    stored = session.storage.fetch(key)
    assert stored is not None and int(stored.value) == 45


def test_racing_join_of_one_id_has_one_winner(consensus_open_session: SessionFactory) -> None:
    """4 sessions join one member id at once: exactly one joins, the others get MemberExistsError."""
    name = unique("ct-group")
    sessions = [consensus_open_session() for _ in range(4)]
    results = _race(sessions, lambda each, index: each.group(name).join("same", str(index).encode()))
    winners = [index for index, result in enumerate(results) if result is None]
    assert len(winners) == 1, results
    assert sum(isinstance(result, MemberExistsError) for result in results) == 3, results
    assert sessions[0].group(name).membership() == {"same": str(winners[0]).encode()}


def test_racing_nominations_elect_exactly_one(consensus_open_session: SessionFactory) -> None:
    """4 sessions nominate at once: exactly one nominate returns True and that candidate leads."""
    service = unique("ct-service")
    sessions = [consensus_open_session() for _ in range(4)]
    results = _race(sessions, lambda each, index: each.election(service).nominate(f"c{index}"))
    assert all(isinstance(result, bool) for result in results), results
    leaders = [index for index, result in enumerate(results) if result is True]
    assert len(leaders) == 1, results
    assert sessions[0].election(service).leader() == f"c{leaders[0]}"
