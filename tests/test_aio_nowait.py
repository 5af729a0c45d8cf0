"""Reads answered on the event loop itself (``aio.connect``'s ``inline_reads``, on by default; SQLite's
``nowait_reader``): same results, no wait for a writer, and a task reading in a loop lets others run."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from pathlib import Path

import pytest

import consensus_api as ca
from consensus_api import aio

#: Far below request_timeout (the busy timeout of an ordinary call): a read that waited would take it.
NO_WAIT = 0.5


def test_nowait_reads_match_the_ordinary_ones_and_do_not_wait_for_a_writer(tmp_path: Path) -> None:
    path = tmp_path / "nowait.db"
    with ca.connect(f"sqlite:///{path}", request_timeout=5) as session:
        storage = session.storage
        version = storage.put("app/k", b"v")
        assert storage.fetch_nowait("app/k") == storage.fetch("app/k") == ca.Versioned(b"v", version)
        assert storage.fetch_nowait("app/none") is None
        assert storage.keys_nowait("app") == storage.keys("app") == {"app/k"}
        with pytest.raises(ca.InvalidKeyError):
            storage.fetch_nowait("/bad/")
        writer = sqlite3.connect(path, isolation_level=None)
        writer.execute("BEGIN IMMEDIATE")  # another writer holds the write lock meanwhile
        writer.execute("UPDATE consensus_kv SET value = x'00' WHERE key = 'app/k'")
        began = time.monotonic()
        assert storage.fetch_nowait("app/k") == ca.Versioned(b"v", version)  # the committed state
        assert time.monotonic() - began < NO_WAIT
        writer.execute("ROLLBACK")
        writer.close()


def test_inline_reads_are_the_reads_of_the_worker_path(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'inline.db'}"

    async def main() -> None:
        async with aio.connect(url) as inline, aio.connect(url, inline_reads=False) as hopping:
            version = await hopping.storage.put("app/k", b"v")
            assert await inline.storage.fetch("app/k") == ca.Versioned(b"v", version)
            assert await inline.storage.keys("app") == {"app/k"}
            newer = await inline.storage.update("app/k", b"w")  # writes still go to a worker
            assert await hopping.storage.fetch("app/k") == ca.Versioned(b"w", newer)
            assert await inline.storage.fetch("app/k") == ca.Versioned(b"w", newer)
            with pytest.raises(ca.InvalidKeyError):
                await inline.storage.fetch("/bad/")
            loop_thread = threading.get_ident()
            threads = set()
            original = inline._session.storage.fetch_nowait

            def spy(key: str) -> ca.Versioned | None:
                threads.add(threading.get_ident())
                return original(key)

            inline._session.storage.fetch_nowait = spy  # type: ignore[method-assign]
            await inline.storage.fetch("app/k")
            assert threads == {loop_thread}
            hopping._session.storage.fetch = spy  # type: ignore[method-assign]
            hopping._session.storage.fetch_nowait = spy  # type: ignore[method-assign]
            threads.clear()
            await hopping.storage.fetch("app/k")
            assert threads and loop_thread not in threads  # inline_reads=False: on a worker
        with pytest.raises(ca.SessionLostError):
            await inline.storage.fetch("app/k")

    asyncio.run(main())
    with pytest.raises(ca.ConfigurationError):
        aio.connect(url, inline_reads="yes")  # type: ignore[arg-type]


def test_a_task_reading_in_a_loop_lets_the_other_tasks_run(tmp_path: Path) -> None:
    async def main() -> None:
        async with aio.connect(f"sqlite:///{tmp_path / 'hold.db'}") as session:
            await session.storage.put("app/k", b"v")
            turns = 0

            async def other() -> None:
                nonlocal turns
                while True:
                    turns += 1
                    await asyncio.sleep(0)

            running = asyncio.create_task(other())
            await asyncio.sleep(0)
            before, began = turns, time.monotonic()
            reads = 0
            while time.monotonic() - began < 0.2:  # awaits nothing but inline reads
                await session.storage.fetch("app/k")
                reads += 1
            assert reads > 0
            assert turns - before >= 10  # at least one turn per INLINE_HOLD (5 ms) of reads
            running.cancel()

    asyncio.run(main())
