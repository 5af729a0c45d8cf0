"""Operation cost: fetch, put, update with a version, fenced update and keys, ours against the raw client.

Per operation: ``op_samples`` calls on each side, interleaved in chunks, give
p50/p99 latency and single-thread throughput; then ``threads`` threads call
it for ``op_seconds`` per side (in alternating halves) for the multi-thread
throughput. Every call succeeds or the workload fails: no error is counted
as a fast call. Target: ours/raw p50 <= 1.10.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import partial

from benchmarks.core import Plan, Row, interleaved, ms, paired_throughput, ratio, wait_for, within
from benchmarks.raw import RawOps
from consensus_api import Leadership, Session

VALUE = b"v" * 100
OPS = ("fetch", "put", "update", "fenced_update", "keys")
TARGET = 1.10
KEYS_IN_NAMESPACE = 20

Call = Callable[[int, int], object]


class _Sides:
    """Both sides' calls for every operation, with per-thread keys and versions."""

    def __init__(self, session: Session, raw: RawOps, base: str, fence: Leadership, threads: int) -> None:
        self.session, self.raw, self.base, self.fence = session, raw, base, fence
        self.versions: dict[tuple[str, int], int] = {}
        self.lock = threading.Lock()
        storage = session.storage
        for namespace in ("put", "upd", "fenced", "keys", ""):
            raw.prepare(f"{base}/{namespace}".rstrip("/"))
        for side in ("ours", "raw"):
            put = storage.put if side == "ours" else raw.put
            put(f"{base}/fetch", VALUE)
            for index in range(KEYS_IN_NAMESPACE):
                put(f"{base}/keys/k{index}", VALUE)
            for thread in range(threads):
                self.versions[(side, thread)] = put(f"{base}/upd/{thread}", VALUE)
                put(f"{base}/fenced/{thread}", VALUE)

    def calls(self, op: str) -> tuple[Call, Call]:
        """``(ours, raw)`` callables of ``(thread, index)`` for ``op``."""
        storage, raw, base = self.session.storage, self.raw, self.base
        if op == "fetch":
            return (lambda t, i: storage.fetch(f"{base}/fetch")), (lambda t, i: raw.fetch(f"{base}/fetch"))
        if op == "put":
            return (
                (lambda t, i: storage.put(f"{base}/put/o{t}-{i}-{self._tick()}", VALUE)),
                (lambda t, i: raw.put(f"{base}/put/r{t}-{i}-{self._tick()}", VALUE)),
            )
        if op == "update":
            return self._update("ours"), self._update("raw")
        if op == "fenced_update":
            fence = self.fence
            return (
                (lambda t, i: storage.update(f"{base}/fenced/{t}", VALUE, fence=fence)),
                (lambda t, i: raw.fenced_update(f"{base}/fenced/{t}", VALUE)),
            )
        return (lambda t, i: storage.keys(f"{base}/keys")), (lambda t, i: raw.keys(f"{base}/keys"))

    def _tick(self) -> int:
        with self.lock:
            self.versions[("tick", 0)] = self.versions.get(("tick", 0), 0) + 1
            return self.versions[("tick", 0)]

    def _update(self, side: str) -> Call:
        storage, raw, base = self.session.storage, self.raw, self.base

        def call(thread: int, index: int) -> None:
            key, version = f"{base}/upd/{thread}", self.versions[(side, thread)]
            if side == "ours":
                self.versions[(side, thread)] = storage.update(key, VALUE, version=version)
            else:
                self.versions[(side, thread)] = raw.update(key, VALUE, version)

        return call


def run(session: Session, raw: RawOps, plan: Plan, run_id: str) -> list[Row]:
    """One row per operation."""
    election = session.election(f"bench-{run_id}-fence")
    election.nominate("me")
    if not wait_for(lambda: election.leader() == "me", 30, interval=0.05):
        raise RuntimeError("the benchmark session did not become leader for the fenced writes")
    fence = election.leadership()
    assert fence is not None
    sides = _Sides(session, raw, f"bench-{run_id}/ops", fence, plan.threads)
    rows = []
    for op in OPS:
        ours, baseline = sides.calls(op)
        ours_1t, raw_1t = partial(ours, 0), partial(baseline, 0)
        interleaved(ours_1t, raw_1t, 10)  # warm-up
        ours_times, raw_times, ours_busy, raw_busy = interleaved(ours_1t, raw_1t, plan.op_samples)
        ours_8t, raw_8t = paired_throughput(ours, baseline, plan.threads, plan.op_seconds)
        ours_p50, raw_p50 = ms(ours_times, 50), ms(raw_times, 50)
        row_ratio = ratio(ours_p50, raw_p50)
        rows.append(
            Row(
                f"op.{op}",
                ours_p50,
                ms(ours_times, 99),
                f"raw {raw.name}",
                raw_p50,
                ms(raw_times, 99),
                row_ratio,
                f"ours/raw p50 <= {TARGET:.2f}",
                within(row_ratio, TARGET),
                extra={
                    "samples": plan.op_samples,
                    "ours_ops_1t": round(len(ours_times) / ours_busy, 1),
                    "baseline_ops_1t": round(len(raw_times) / raw_busy, 1),
                    f"ours_ops_{plan.threads}t": ours_8t,
                    f"baseline_ops_{plan.threads}t": raw_8t,
                },
            )
        )
    election.resign("me")
    return rows
