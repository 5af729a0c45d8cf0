"""SQLite's change feed sleeps on a file watch (inotify, Linux), not a poll: a commit wakes it."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import consensus_api as ca
from consensus_backends.sql.filewatch import FileWatch


def test_a_commit_to_the_database_wakes_the_watch_and_other_files_do_not(tmp_path: Path) -> None:
    database = tmp_path / "watched.db"
    with sqlite3.connect(database) as setup:
        setup.execute("PRAGMA journal_mode=WAL")
        setup.execute("CREATE TABLE t (x)")
    watch = FileWatch.open(str(database))
    assert watch is not None
    try:
        assert watch.wait(0.05) is False  # nothing written
        (tmp_path / "unrelated.txt").write_text("not the database")
        assert watch.wait(0.2) is False
        writer = sqlite3.connect(database)
        writer.execute("INSERT INTO t VALUES (1)")
        writer.commit()
        assert watch.wait(5.0) is True
        writer.close()
    finally:
        watch.close()


def test_interrupt_ends_a_wait_at_once(tmp_path: Path) -> None:
    watch = FileWatch.open(str(tmp_path / "quiet.db"))
    assert watch is not None
    threading.Timer(0.1, watch.interrupt).start()
    started = time.monotonic()
    try:
        assert watch.wait(30.0) is False
        assert time.monotonic() - started < 5.0
    finally:
        watch.close()


def test_a_change_reaches_a_listener_long_before_the_poll_interval(tmp_path: Path) -> None:
    """With ``poll_interval`` at 60 s the feed still sees another session's write at once: the file
    watch wakes it. Closing does not wait for the poll either."""
    url = f"sqlite:///{tmp_path / 'feed.db'}"
    seen = threading.Event()
    with ca.connect(url) as writer, ca.connect(url, poll_interval=60) as watcher:
        writer.storage.put("k", b"start")

        def on_change(event: ca.ValueChanged) -> None:
            if event.value == b"new":
                seen.set()

        watcher.listeners.add_value_listener("k", on_change)
        time.sleep(0.2)
        writer.storage.update("k", b"new")
        assert seen.wait(10.0)
        started = time.monotonic()
    assert time.monotonic() - started < 10.0


def test_no_watch_where_the_kernel_refuses_one(tmp_path: Path) -> None:
    """A directory inotify cannot watch (here: none) gives no watch; the feed then polls."""
    assert FileWatch.open(str(tmp_path / "missing" / "x.db")) is None
