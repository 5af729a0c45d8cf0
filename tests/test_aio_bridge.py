"""The aio bridge on its own (no backend): bounded workers, cancellation, shutdown, and what a cancelled
call returns handed to ``undo``."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

import consensus_api as ca
from consensus_api.aio._bridge import Bridge

TIMEOUT = 20.0


def run(main: Callable[[], Awaitable[Any]]) -> Any:
    """Run ``main()`` in a new loop, bounded by TIMEOUT."""

    async def bounded() -> Any:
        return await asyncio.wait_for(main(), TIMEOUT)

    return asyncio.run(bounded())


def test_bridge_runs_at_most_workers_calls_and_shutdown_fails_the_queued_ones() -> None:
    """Calls blocked in the core run ``workers`` at a time in arrival order; a queued one that is
    cancelled never runs; ``shutdown`` lets running calls finish and fails queued and later ones
    with SessionLostError."""
    release = threading.Event()
    running: set[int] = set()
    ran: list[int] = []
    peak = 0
    guard = threading.Lock()

    def blocked(number: int) -> Callable[[], int]:
        def call() -> int:
            nonlocal peak
            with guard:
                running.add(number)
                peak = max(peak, len(running))
            release.wait(TIMEOUT)
            with guard:
                running.discard(number)
                ran.append(number)
            return number

        return call

    async def running_count(expected: int) -> None:
        deadline = time.monotonic() + TIMEOUT
        while len(running) != expected:
            assert time.monotonic() < deadline, running
            await asyncio.sleep(0.01)

    async def main() -> None:
        bridge = Bridge(asyncio.get_running_loop(), 2)
        calls = [asyncio.create_task(bridge.run(blocked(number))) for number in range(5)]
        await running_count(2)
        await asyncio.sleep(0.1)
        assert running == {0, 1}
        calls[4].cancel()
        with pytest.raises(asyncio.CancelledError):
            await calls[4]
        release.set()
        assert await asyncio.gather(*calls[:4]) == [0, 1, 2, 3]
        assert peak == 2
        assert 4 not in ran

        release.clear()
        last = [asyncio.create_task(bridge.run(blocked(number))) for number in (10, 11, 12)]
        await running_count(2)
        bridge.shutdown()
        with pytest.raises(ca.SessionLostError):
            await last[2]
        release.set()
        assert list(await asyncio.gather(last[0], last[1])) == [10, 11]
        with pytest.raises(ca.SessionLostError, match="closed"):
            await bridge.run(lambda: 1)
        assert 12 not in ran

    run(main)


def test_a_call_cancelled_while_running_hands_its_result_to_undo() -> None:
    """A call cancelled while it runs completes on its worker and what it returns goes to ``undo``,
    on a worker; once the bridge is shut down (the session closed) nothing is handed back."""
    given_back: list[tuple[int, bool]] = []

    def blocked(started: threading.Event, release: threading.Event, result: int) -> Callable[[], int]:
        def call() -> int:
            started.set()
            release.wait(TIMEOUT)
            return result

        return call

    def undo(result: int) -> None:
        given_back.append((result, threading.current_thread() is threading.main_thread()))

    async def cancelled_while_running(bridge: Bridge, result: int) -> threading.Event:
        started, release = threading.Event(), threading.Event()
        task = asyncio.create_task(bridge.run(blocked(started, release, result), undo=undo))
        while not started.is_set():
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return release

    async def main() -> None:
        bridge = Bridge(asyncio.get_running_loop(), 2)
        (await cancelled_while_running(bridge, 7)).set()
        deadline = time.monotonic() + TIMEOUT
        while not given_back:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        assert given_back == [(7, False)]
        release = await cancelled_while_running(bridge, 8)
        bridge.shutdown()
        release.set()
        await asyncio.sleep(0.3)
        assert given_back == [(7, False)]

    run(main)
