"""Append-only JSON-lines journals, one per client process (and one for the runner).

A record is written with one ``write(2)`` on an ``O_APPEND`` descriptor before
``write`` returns, so it survives a SIGKILL of the writer; a reader skips a
torn last line. Records carry the journal's ``spawn`` number and ``client``
slot; ``convert`` turns them into history rows.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any


class Journal:
    """A thread-safe writer of one process's records."""

    def __init__(self, path: Path, spawn: int, client: int) -> None:
        self.path = path
        self.spawn = spawn
        self.client = client
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._lock = threading.Lock()

    def write(self, record: dict[str, Any]) -> None:
        """Append ``record`` (``time_ns`` defaults to now) with this journal's spawn and client."""
        record.setdefault("time_ns", time.monotonic_ns())
        record["spawn"] = self.spawn
        record["client"] = self.client
        line = (json.dumps(record, separators=(",", ":")) + "\n").encode()
        with self._lock:
            os.write(self._fd, line)

    def close(self) -> None:
        """Close the descriptor. Idempotent."""
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


def read_journal(path: Path) -> Iterator[dict[str, Any]]:
    """The records of a journal in write order; a torn or unreadable line is skipped."""
    with path.open("rb") as handle:
        for line in handle:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                yield record
