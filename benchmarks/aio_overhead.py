"""The asyncio API's cost: ``await`` of ``consensus_api.aio`` against the same synchronous call.

Per operation (fetch, put): ``op_samples`` calls on each side, interleaved in
chunks of 10 whose order flips every round, on one event loop; the aio side is a
second session on the same URL, opened with the defaults (reads inline on the
loop where the backend answers them without waiting: SQLite; every other call
on a worker thread). Target: aio/sync p50 <= 1.15.

The fetch row also carries the raw client's own asyncio read against its
blocking read, interleaved the same way in the same run (``raw_async_ratio``,
``benchmarks.raw_async``), where the client has an asyncio API: the least an
awaited call of that client costs here. Then ``benchmarks.aio_concurrency``'s
rows: the aio session against that asyncio client, with 1,000 calls in flight
and one at a time.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable

from benchmarks import aio_concurrency
from benchmarks.core import Plan, Row, ms, ratio, within
from benchmarks.raw_async import open_raw_async
from consensus_api import Session, aio

VALUE = b"v" * 100
OPS = ("fetch", "put")
TARGET = 1.15
CHUNK = 10


def run(session: Session, url: str, plan: Plan, run_id: str) -> list[Row]:
    """One row per operation."""
    return asyncio.run(_rows(session, url, plan, f"bench-{run_id}/aio"))


async def _rows(session: Session, url: str, plan: Plan, base: str) -> list[Row]:
    rows = []
    raw_async = await _raw_async_floor(url, base, plan)
    async with aio.connect(url) as async_session:
        await async_session.storage.put(f"{base}/fetch", VALUE)
        for op in OPS:
            sync_call, async_call = _calls(session, async_session, base, op)
            await _interleaved(sync_call, async_call, 20)  # warm-up
            sync_times, async_times = await _interleaved(sync_call, async_call, plan.op_samples)
            ours, baseline = ms(async_times, 50), ms(sync_times, 50)
            row_ratio = ratio(ours, baseline)
            floor = raw_async if op == "fetch" else None
            rows.append(
                Row(
                    f"aio.{op}",
                    ours,
                    ms(async_times, 99),
                    f"sync {op}",
                    baseline,
                    ms(sync_times, 99),
                    row_ratio,
                    f"aio/sync p50 <= {TARGET:.2f}",
                    within(row_ratio, TARGET),
                    note=floor[0] if floor else None,
                    extra={"samples": plan.op_samples, **(floor[1] if floor else {})},
                )
            )
        rows += await aio_concurrency.rows(async_session, url, plan, base)
    return rows


async def _raw_async_floor(url: str, base: str, plan: Plan) -> tuple[str, dict[str, object]] | None:
    """The raw client's asyncio read against its blocking read (a note and extra fields), if it has one."""
    raw = await open_raw_async(url, base.replace("/", "-"))
    if raw is None:
        return None
    try:
        sync_call, async_call = (lambda i: raw.read()), (lambda i: raw.read_async())
        await _interleaved(sync_call, async_call, 20)  # warm-up
        blocking, awaited = await _interleaved(sync_call, async_call, plan.op_samples)
    finally:
        await raw.close()
    floor = ratio(ms(awaited, 50), ms(blocking, 50))
    fields: dict[str, object] = {
        "raw_async": raw.name,
        "raw_async_p50_ms": ms(awaited, 50),
        "raw_blocking_p50_ms": ms(blocking, 50),
        "raw_async_ratio": floor,
    }
    return f"{raw.name} read / blocking read p50 in this run: {floor}", fields


def _calls(
    session: Session, async_session: aio.AsyncSession, base: str, op: str
) -> tuple[Callable[[int], object], Callable[[int], Awaitable[object]]]:
    if op == "fetch":
        return (lambda i: session.storage.fetch(f"{base}/fetch")), (
            lambda i: async_session.storage.fetch(f"{base}/fetch")
        )
    fresh = itertools.count()
    return (lambda i: session.storage.put(f"{base}/put/s{next(fresh)}", VALUE)), (
        lambda i: async_session.storage.put(f"{base}/put/a{next(fresh)}", VALUE)
    )


async def _interleaved(
    sync_call: Callable[[int], object], async_call: Callable[[int], Awaitable[object]], samples: int
) -> tuple[list[float], list[float]]:
    """Latencies (seconds) of ``samples`` calls of each side, alternating in chunks."""
    sync_times: list[float] = []
    async_times: list[float] = []
    for done in range(0, samples, CHUNK):
        indices = range(done, min(done + CHUNK, samples))
        for side in ("sync", "aio") if (done // CHUNK) % 2 == 0 else ("aio", "sync"):
            for index in indices:
                begin = time.perf_counter()
                if side == "sync":
                    sync_call(index)
                    sync_times.append(time.perf_counter() - begin)
                else:
                    await async_call(index)
                    async_times.append(time.perf_counter() - begin)
    return sync_times, async_times
