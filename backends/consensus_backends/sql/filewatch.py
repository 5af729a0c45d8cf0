"""``FileWatch``: wake SQLite's change feed when any process writes the database, instead of polling.

SQLite in WAL mode commits by ``write()``-ing frames to ``<database>-wal`` and then publishing them
in the ``-shm`` wal-index (a shared memory map, which no file event reports); a checkpoint writes
the database file itself. An inotify watch on the database's directory, for writes to, creation
of and renames onto the database file and its ``-wal`` and ``-journal``, so reports every commit
of every process on this machine, and also survives the file being replaced (it watches names,
not an inode). A wake is a hint only: the feed still asks ``PRAGMA data_version`` whether a commit
is visible, and looks again shortly after a wake that came before the commit was published.

Linux only, and only where the optional ``inotify_simple`` package is installed and the kernel
grants an instance and a watch (one of each per session; ``fs.inotify.max_user_instances``, often
128 per user, and ``max_user_watches``); ``FileWatch.open`` returns None otherwise and that
session's feed polls as before. Writes by another host (a network file system) raise no event: the feed's
safety poll still sees them, a second late at most.
"""

from __future__ import annotations

import logging
import os
import select
import sys
import time
from typing import Any

log = logging.getLogger("consensus_api.sql")

#: The files a commit or a checkpoint writes, after the database's own name.
SUFFIXES = ("", "-wal", "-journal")


class FileWatch:
    """An inotify watch on a SQLite database's files; ``wait`` blocks until they are written."""

    def __init__(self, inotify: Any, names: frozenset[str], overflow: int) -> None:
        self._inotify = inotify
        self._names = names
        self._overflow = overflow  # the kernel dropped events: counts as a write
        self._wake_read, self._wake_write = os.pipe()
        self._poller = select.poll()
        self._poller.register(inotify.fileno(), select.POLLIN)
        self._poller.register(self._wake_read, select.POLLIN)

    @classmethod
    def open(cls, database: str) -> FileWatch | None:
        """A watch on ``database``'s files, or None where none can be had (not Linux, no
        ``inotify_simple``, the kernel refused: its limits, a file system without inotify)."""
        if not sys.platform.startswith("linux"):
            return None
        try:
            from inotify_simple import INotify, flags  # noqa: PLC0415 - optional (the sql extra), Linux only
        except ImportError:
            return None
        path = os.path.abspath(database)
        directory, name = os.path.split(path)
        try:
            inotify = INotify()
        except OSError as exc:  # fs.inotify.max_user_instances reached
            log.debug("no file watch on %s (%s): the change feed polls", directory, exc)
            return None
        try:
            inotify.add_watch(directory, flags.MODIFY | flags.CREATE | flags.MOVED_TO | flags.DELETE)
        except OSError as exc:
            log.debug("no file watch on %s (%s): the change feed polls", directory, exc)
            inotify.close()
            return None
        return cls(inotify, frozenset(name + suffix for suffix in SUFFIXES), flags.Q_OVERFLOW)

    def wait(self, timeout: float) -> bool:
        """Block until the database's files are written (True), ``timeout`` seconds pass or
        ``interrupt`` is called (False). Events of other files in the directory are skipped."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            ready = {descriptor for descriptor, _ in self._poller.poll(left * 1000)}
            if self._wake_read in ready:
                return False
            if ready and any(
                event.name in self._names or event.mask & self._overflow
                for event in self._inotify.read(timeout=0)
            ):
                return True

    def interrupt(self) -> None:
        """End the current and every later ``wait`` at once (the feed stops)."""
        os.write(self._wake_write, b"x")

    def close(self) -> None:
        """Release the watch and the descriptors."""
        self._inotify.close()
        os.close(self._wake_read)
        os.close(self._wake_write)
