"""The identity of a SQLite database file: a file deleted or replaced under live sessions.

Connections opened before the change go on writing to the old file (an
unlinked inode, or the one renamed away) while new sessions write to the new
one: two leaders at the same term, each one's fenced writes succeeding. The
backend compares the path's ``(st_dev, st_ino)`` with the one it opened at each
heartbeat (then loses the session and reopens on the new file) and before each
application write (refused with ``SessionLostError`` meanwhile).
"""

from __future__ import annotations

import os

#: The identity of a path with no file.
MISSING = (-1, -1)


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
