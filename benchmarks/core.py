"""What every workload shares: sizes, statistics, result rows, timing loops and bounded waits."""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

#: Every wait for an event in the benchmarks ends after this many seconds at most.
EVENT_TIMEOUT = 10.0
#: Untimed rounds before the timed samples of the latency workloads that measure one event at a
#: time (propagation, membership), on each side alike: a fresh process's or session's first calls
#: compile statements and warm code paths (a PostgreSQL joiner's first join took 9-14 ms, later
#: ones 1.3-2 ms), and with 60 samples that one start-up cost would be the p99.
WARM_UP = 3


@dataclass(frozen=True)
class Plan:
    """How much of each workload to run; ``quick`` scales everything down."""

    quick: bool
    op_samples: int
    op_seconds: float
    threads: int
    propagation_samples: int
    membership_samples: int
    failover_reps: dict[float, int]
    members: int
    groups: int
    per_group: int
    watched_keys: int
    sessions: int
    scale_timeout: float

    @classmethod
    def make(cls, quick: bool) -> Plan:
        """The sizes for a full run, or the scaled-down ``--quick`` ones."""
        if quick:
            return cls(True, 300, 0.4, 8, 150, 60, {2.0: 2}, 200, 20, 10, 1000, 5, 90.0)
        return cls(False, 300, 1.5, 8, 150, 60, {2.0: 8, 10.0: 4}, 5000, 500, 10, 10_000, 20, 600.0)

    def scale_note(self) -> str:
        """How this run's scale workloads compare to the full ones."""
        if not self.quick:
            return ""
        return (
            f"--quick: scaled down to {self.members} members, {self.groups} groups of {self.per_group}, "
            f"{self.watched_keys} watched keys (full: 5000, 500 x 10, 10000)"
        )


def run_id() -> str:
    """A short unique name for one run's keys, groups and services."""
    return uuid.uuid4().hex[:8]


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) with linear interpolation; ValueError when empty."""
    if not values:
        raise ValueError("no samples")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def ms(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile of ``values`` (seconds) in milliseconds, or None without samples."""
    return round(percentile(values, q) * 1000, 3) if values else None


@dataclass
class Row:
    """One workload's result: the JSON row of ``consensus bench --json``.

    ``ratio`` is ours/baseline of the statistic the target is about (p50 for
    operations, p99 otherwise); ``holds`` is None where no target applies.
    """

    workload: str
    ours_p50_ms: float | None
    ours_p99_ms: float | None
    baseline: str | None = None
    baseline_p50_ms: float | None = None
    baseline_p99_ms: float | None = None
    ratio: float | None = None
    target: str | None = None
    holds: bool | None = None
    note: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        """The row as a flat JSON object (``extra`` fields after the fixed ones)."""
        fixed = {name: value for name, value in vars(self).items() if name != "extra"}
        return {**fixed, **self.extra}


def ratio(ours: float | None, baseline: float | None) -> float | None:
    """``ours / baseline`` rounded, or None when either is missing."""
    if ours is None or not baseline:
        return None
    return round(ours / baseline, 3)


def within(value: float | None, limit: float | None) -> bool | None:
    """``value <= limit``; False when the value is missing, None when there is no limit."""
    if limit is None:
        return None
    return value is not None and value <= limit


def interleaved(
    ours: Callable[[int], object], raw: Callable[[int], object], samples: int, chunk: int = 10
) -> tuple[list[float], list[float], float, float]:
    """Latencies (seconds) of ``samples`` calls of each, alternating in chunks (order flipped each
    round so neither side always goes first), and the busy time of each side."""
    times: tuple[list[float], list[float]] = ([], [])
    busy = [0.0, 0.0]
    sides = (ours, raw)
    done = 0
    while done < samples:
        count = min(chunk, samples - done)
        order = (0, 1) if (done // chunk) % 2 == 0 else (1, 0)
        for side in order:
            call = sides[side]
            start = time.perf_counter()
            for index in range(done, done + count):
                begin = time.perf_counter()
                call(index)
                times[side].append(time.perf_counter() - begin)
            busy[side] += time.perf_counter() - start
        done += count
    return times[0], times[1], busy[0], busy[1]


def throughput(call: Callable[[int, int], object], threads: int, seconds: float) -> float:
    """Calls per second of ``call(thread, index)`` from ``threads`` threads for ``seconds``."""
    counts = [0] * threads
    errors: list[BaseException] = []
    stop = time.perf_counter() + seconds
    barrier = threading.Barrier(threads + 1)

    def work(thread: int) -> None:
        barrier.wait(EVENT_TIMEOUT)
        index = 0
        try:
            while time.perf_counter() < stop:
                call(thread, index)
                index += 1
        except BaseException as exc:  # reported to the caller below
            errors.append(exc)
        counts[thread] = index

    workers = [threading.Thread(target=work, args=(t,), daemon=True) for t in range(threads)]
    for worker in workers:
        worker.start()
    barrier.wait(EVENT_TIMEOUT)
    begin = time.perf_counter()
    for worker in workers:
        worker.join(seconds + EVENT_TIMEOUT * 3)
    elapsed = time.perf_counter() - begin
    if errors:
        raise errors[0]
    return sum(counts) / elapsed if elapsed > 0 else 0.0


def paired_throughput(
    ours: Callable[[int, int], object], raw: Callable[[int, int], object], threads: int, seconds: float
) -> tuple[float, float]:
    """Throughput of each side, measured in two alternating halves (ours, raw, raw, ours)."""
    half = seconds / 2
    first = throughput(ours, threads, half), throughput(raw, threads, half)
    second = throughput(raw, threads, half), throughput(ours, threads, half)
    return round((first[0] + second[1]) / 2, 1), round((first[1] + second[0]) / 2, 1)


class Stamp:
    """The time (``time.monotonic``) at which something happened, set once, awaited with a bound."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.at: float | None = None

    def set(self, at: float | None = None) -> None:
        """Record ``at`` (default: now) unless already set."""
        if not self._event.is_set():
            self.at = time.monotonic() if at is None else at
            self._event.set()

    def wait(self, timeout: float = EVENT_TIMEOUT) -> float | None:
        """The recorded time, or None if nothing happened within ``timeout``."""
        return self.at if self._event.wait(timeout) else None


def wait_for(predicate: Callable[[], bool], timeout: float, interval: float = 0.01) -> bool:
    """Poll ``predicate`` until it holds (True) or ``timeout`` passes (False)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)
    return True


def rss_mb(pid: int | None = None) -> float:
    """Resident memory of a process (default: this one) in MiB, from ``/proc``."""
    statm = f"/proc/{pid or os.getpid()}/statm"
    with open(statm) as handle:
        resident_pages = int(handle.read().split()[1])
    return resident_pages * os.sysconf("SC_PAGE_SIZE") / 2**20
