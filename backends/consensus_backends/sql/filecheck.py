"""The identity of a SQLite database file: a file deleted or replaced under live sessions.

Connections opened before the change go on writing to the old file (an
unlinked inode, or the one renamed away) while new sessions write to the new
one: two leaders at the same term, each one's fenced writes succeeding. The
backend compares the path's ``(st_dev, st_ino)`` with the one it opened at each
heartbeat (then loses the session and reopens on the new file) and before each
application write (refused with ``SessionLostError`` meanwhile).

``unusable_file`` tells, before a session opens, why SQLite could never use a
path (no retry heals it): the session fails at once instead of after
``connect_timeout``.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

#: The identity of a path with no file.
MISSING = (-1, -1)


def unusable_file(path: str) -> str | None:
    """Why SQLite can never open ``path`` as a database to write, as far as the file system tells: a
    missing directory, a directory, no permission, a file that is not a database; None otherwise."""
    target = Path(path)
    if target.is_dir():
        return f"{path} is a directory"
    if not target.exists():
        if not target.parent.is_dir():
            return f"there is no directory {target.parent}"
        if not os.access(target.parent, os.W_OK | os.X_OK):
            return f"permission denied: no file can be created in {target.parent}"
        return None
    if not os.access(target, os.R_OK | os.W_OK):
        return f"permission denied: {path} is not readable and writable"
    return _not_a_database(path)


def _not_a_database(path: str) -> str | None:
    """Whether SQLite itself finds ``path`` is no database, asked through SQLite: a plain ``open`` and
    ``close`` of the file here would drop the POSIX locks every SQLite connection of this process
    holds on it (``fcntl`` locks belong to the process, and any close of the file releases them)."""
    uri = f"{Path(path).absolute().as_uri()}?mode=ro"
    try:
        connection = sqlite3.connect(uri, uri=True, timeout=0, check_same_thread=False)
    except sqlite3.Error:
        return None  # what SQLite makes of it is reported when the session opens the file
    try:
        connection.execute("PRAGMA schema_version").fetchone()
    except sqlite3.DatabaseError as exc:
        if "not a database" in str(exc):
            return f"{path} is not a SQLite database"
    finally:
        connection.close()
    return None


class FileIdentity:
    """``(st_dev, st_ino)`` of ``path`` as armed; ``changed()`` compares the path's current one."""

    def __init__(self, path: str | None) -> None:
        self._path = path
        self._armed: tuple[int, int] | None = None

    def arm(self) -> None:
        """Take the file now at the path as this session's (after connecting to it)."""
        self._armed = self._read()

    @property
    def armed(self) -> bool:
        """Whether ``arm`` has taken a file (a session was opened on it)."""
        return self._armed is not None

    def changed(self) -> bool:
        """The path now names another file, or none (False before ``arm`` and for non-SQLite)."""
        return self._armed is not None and self._read() != self._armed

    def _read(self) -> tuple[int, int]:
        if self._path is None:
            return MISSING
        try:
            status = os.stat(self._path)
        except FileNotFoundError:
            return MISSING
        return status.st_dev, status.st_ino

    def describe(self) -> str:
        """What happened to the file, for logs and errors."""
        return f"the database file {self._path} was {'deleted' if self._read() == MISSING else 'replaced'}"
