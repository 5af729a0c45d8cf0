"""Reads answered on the event loop itself (``aio.connect``'s ``inline_reads``, on by default; SQLite's
``nowait_reader``): same results, no wait for a writer, and a task reading in a loop lets others run."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import consensus_api as ca
from consensus_api import aio
from consensus_api.backend import WouldBlock

#: Far below request_timeout (the busy timeout of an ordinary call): a read that waited would take it.
NO_WAIT = 0.5


@contextlib.asynccontextmanager
async def counting_turns(pause: float) -> AsyncIterator[list[int]]:
    """``[turns]``: how often another task got the loop (it counts, then sleeps ``pause``)."""
    turns = [0]

    async def other() -> None:
        while True:
            turns[0] += 1
            await asyncio.sleep(pause)

    running = asyncio.create_task(other())
    try:
        yield turns
    finally:
        running.cancel()


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
            original = inline._sync.storage.fetch_nowait

            def spy(key: str) -> ca.Versioned | None:
                threads.add(threading.get_ident())
                return original(key)

            inline._sync.storage.fetch_nowait = spy  # type: ignore[method-assign]
            await inline.storage.fetch("app/k")
            assert threads == {loop_thread}
            hopping._sync.storage.fetch = spy  # type: ignore[method-assign]
            hopping._sync.storage.fetch_nowait = spy  # type: ignore[method-assign]
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
            async with counting_turns(0) as turns:
                await asyncio.sleep(0)
                before, began = turns[0], time.monotonic()
                reads = 0
                while time.monotonic() - began < 0.2:  # awaits nothing but inline reads
                    await session.storage.fetch("app/k")
                    reads += 1
                assert reads > 0
                assert turns[0] - before >= 10  # at least one turn per INLINE_HOLD (5 ms) of reads

    asyncio.run(main())


def test_nowait_writes_are_the_ordinary_writes_or_do_nothing(tmp_path: Path) -> None:
    """Same results and errors as the ordinary writes (fences included); with another writer holding
    the write lock, ``WouldBlock`` at once and nothing written."""
    path = tmp_path / "writes.db"
    with ca.connect(f"sqlite:///{path}", request_timeout=5) as session:
        storage = session.storage
        assert storage.can_write_nowait
        version = storage.put_nowait("app/k", b"v")
        assert storage.fetch("app/k") == ca.Versioned(b"v", version)
        with pytest.raises(ca.KeyExistsError):
            storage.put_nowait("app/k", b"again")
        with pytest.raises(ca.VersionConflictError):
            storage.update_nowait("app/k", b"w", version=version + 100)
        newer = storage.update_nowait("app/k", b"w", version=version)
        assert storage.fetch("app/k") == ca.Versioned(b"w", newer)
        election = session.election("svc")
        election.nominate("me")
        fence = election.leadership()
        assert fence is not None
        fenced = storage.update_nowait("app/k", b"f", fence=fence)
        stale = ca.Leadership("svc", "me", fence.term + 1)
        with pytest.raises(ca.FencedError):
            storage.update_nowait("app/k", b"stale", fence=stale)
        with pytest.raises(ca.InvalidKeyError):
            storage.put_nowait("/bad/", b"v")
        writer = sqlite3.connect(path, isolation_level=None)
        writer.execute("BEGIN IMMEDIATE")  # another writer holds the write lock meanwhile
        began = time.monotonic()
        with pytest.raises(WouldBlock):
            storage.put_nowait("app/other", b"v")
        with pytest.raises(WouldBlock):
            storage.delete_nowait("app/k")
        assert time.monotonic() - began < NO_WAIT
        writer.execute("ROLLBACK")
        writer.close()
        assert storage.fetch("app/other") is None
        assert storage.fetch("app/k") == ca.Versioned(b"f", fenced)
        storage.delete_nowait("app/k", version=fenced)
        assert storage.fetch("app/k") is None


def test_inline_writes_run_on_the_loop_and_wait_on_a_worker(tmp_path: Path) -> None:
    """A write runs on the loop when the write lock is free; while another writer holds it, the
    write waits on a worker (the loop keeps running) and completes once the lock is free."""
    path = tmp_path / "inline-writes.db"

    async def main() -> None:
        async with aio.connect(f"sqlite:///{path}", request_timeout=5) as session:
            loop_thread = threading.get_ident()
            threads: set[int] = set()
            original = session._sync.storage.put_nowait

            def spy(*args: object, **kwargs: object) -> int:
                threads.add(threading.get_ident())
                return original(*args, **kwargs)  # type: ignore[arg-type]

            session._sync.storage.put_nowait = spy  # type: ignore[method-assign]
            first = await session.storage.put("app/a", b"1")
            assert threads == {loop_thread}
            writer = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            writer.execute("BEGIN IMMEDIATE")
            async with counting_turns(0.01) as turns:
                asyncio.get_running_loop().call_later(0.5, writer.execute, "ROLLBACK")
                began = time.monotonic()
                second = await session.storage.put("app/b", b"2")
                assert 0.4 < time.monotonic() - began < 4  # it waited for the lock, on a worker
                assert turns[0] >= 20  # the loop ran meanwhile
            writer.close()
            assert await session.storage.fetch("app/a") == ca.Versioned(b"1", first)
            assert await session.storage.fetch("app/b") == ca.Versioned(b"2", second)
        async with aio.connect(f"sqlite:///{path}", inline_writes=False) as hopping:
            threads.clear()
            ordinary = hopping._sync.storage.put

            def spy_put(*args: object, **kwargs: object) -> int:
                threads.add(threading.get_ident())
                return ordinary(*args, **kwargs)  # type: ignore[arg-type]

            hopping._sync.storage.put = spy_put  # type: ignore[method-assign]
            await hopping.storage.put("app/c", b"3")
            assert threads and loop_thread not in threads  # inline_writes=False: on a worker

    asyncio.run(main())
    with pytest.raises(ca.ConfigurationError):
        aio.connect(f"sqlite:///{path}", inline_writes="yes")  # type: ignore[arg-type]
