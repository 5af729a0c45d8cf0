"""``consensus_api.aio`` against the raw client's own asyncio API: what an asyncio service feels.

Two rows per backend whose client has an asyncio API (``benchmarks.raw_async``:
etcd, ZooKeeper, PostgreSQL, Redis), both sides in the same process and run,
on one event loop:

* ``aio.fetch.in_flight``: ``IN_FLIGHT`` awaited ``storage.fetch`` of one key
  gathered at once, against as many raw asyncio reads; ``ROUNDS`` rounds per
  side, alternating (ours, raw, raw, ours, ...). Reads per second over all of a
  side's rounds (p50/p99: each call's time from its round's start). Target:
  ours/raw reads/s >= ``THROUGHPUT_TARGET``.
* ``aio.fetch.vs_raw_async``: one awaited call at a time, interleaved in chunks
  of 10 whose order flips every round. Target: ours/raw p50 <= ``P50_TARGET``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from benchmarks.core import Plan, Row, ms, ratio, within
from benchmarks.raw_async import RawAsyncRead, open_raw_async
from consensus_api import aio

VALUE = b"v" * 100
IN_FLIGHT = 1_000
ROUNDS = 3
THROUGHPUT_TARGET = 0.9
P50_TARGET = 1.10
CHUNK = 10


async def rows(session: aio.AsyncSession, url: str, plan: Plan, base: str) -> list[Row]:
    """The two rows, or none where the raw client has no asyncio API."""
    raw = await open_raw_async(url, f"{base}-conc".replace("/", "-"))
    if raw is None:
        return []
    key = f"{base}/in-flight"
    try:
        await session.storage.put(key, VALUE)
        ours, theirs = (lambda: session.storage.fetch(key)), raw.read_async
        await _gathered(ours, 100)  # warm-up: connections opened, statements prepared
        await _gathered(theirs, 100)
        return [await _in_flight(ours, theirs, raw), await _one_at_a_time(ours, theirs, raw, plan)]
    finally:
        await raw.close()


async def _in_flight(
    ours: Callable[[], Awaitable[object]], theirs: Callable[[], Awaitable[object]], raw: RawAsyncRead
) -> Row:
    seconds = {"ours": 0.0, "raw": 0.0}
    waits: dict[str, list[float]] = {"ours": [], "raw": []}
    for number in range(ROUNDS):
        order = (("ours", ours), ("raw", theirs)) if number % 2 == 0 else (("raw", theirs), ("ours", ours))
        for side, call in order:
            seconds[side] += await _gathered(call, IN_FLIGHT, waits[side])
    ours_rate = round(ROUNDS * IN_FLIGHT / seconds["ours"], 1)
    raw_rate = round(ROUNDS * IN_FLIGHT / seconds["raw"], 1)
    row_ratio = ratio(ours_rate, raw_rate)
    return Row(
        "aio.fetch.in_flight",
        ms(waits["ours"], 50),
        ms(waits["ours"], 99),
        f"raw {raw.name}",
        ms(waits["raw"], 50),
        ms(waits["raw"], 99),
        row_ratio,
        f"ours/raw reads/s >= {THROUGHPUT_TARGET:.2f}",
        row_ratio is not None and row_ratio >= THROUGHPUT_TARGET,
        note=f"{IN_FLIGHT} fetches gathered at once, {ROUNDS} rounds per side; p50/p99: each call's "
        "time from the round's start",
        extra={"in_flight": IN_FLIGHT, "ours_reads_per_s": ours_rate, "baseline_reads_per_s": raw_rate},
    )


async def _one_at_a_time(
    ours: Callable[[], Awaitable[object]],
    theirs: Callable[[], Awaitable[object]],
    raw: RawAsyncRead,
    plan: Plan,
) -> Row:
    times: dict[str, list[float]] = {"ours": [], "raw": []}
    for done in range(0, plan.op_samples, CHUNK):
        order = (
            (("ours", ours), ("raw", theirs))
            if (done // CHUNK) % 2 == 0
            else (("raw", theirs), ("ours", ours))
        )
        for side, call in order:
            for _ in range(min(CHUNK, plan.op_samples - done)):
                begin = time.perf_counter()
                await call()
                times[side].append(time.perf_counter() - begin)
    ours_p50, raw_p50 = ms(times["ours"], 50), ms(times["raw"], 50)
    row_ratio = ratio(ours_p50, raw_p50)
    return Row(
        "aio.fetch.vs_raw_async",
        ours_p50,
        ms(times["ours"], 99),
        f"raw {raw.name}",
        raw_p50,
        ms(times["raw"], 99),
        row_ratio,
        f"ours/raw p50 <= {P50_TARGET:.2f}",
        within(row_ratio, P50_TARGET),
        extra={"samples": plan.op_samples},
    )


async def _gathered(
    call: Callable[[], Awaitable[object]], count: int, waits: list[float] | None = None
) -> float:
    """Seconds for ``count`` calls gathered at once (every one must succeed); each call's time from
    the start is added to ``waits``."""
    begin = time.perf_counter()

    async def timed() -> None:
        await call()
        if waits is not None:
            waits.append(time.perf_counter() - begin)

    await asyncio.gather(*(timed() for _ in range(count)))
    return time.perf_counter() - begin
