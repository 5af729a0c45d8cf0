"""An idle stream that keeps grpc's polling thread of a channel alive.

grpc runs a channel's completion queue on a thread it starts when a call made
through a future (``stub.Method.future``) finds no other call in flight, and
ends when the last one completes; a client making one call at a time so
starts a thread per call, which costs more than the call itself (about 1-3 ms
on a loaded 2-core machine). An open stream keeps that thread alive.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

from pyetcd import etcdrpc

Metadata = tuple[tuple[str, str], ...] | None


class KeepWarm:
    """An idle watch stream (no watch is ever created on it) that keeps grpc's polling thread of
    ``channel`` alive; reopened at the next call, at most once a second, after it ends."""

    LIFETIME = 3600.0
    REOPEN_PAUSE = 1.0

    def __init__(self, channel: Any, metadata: Metadata) -> None:
        self.channel = channel
        self._opened = time.monotonic()
        self._stop = threading.Event()
        self._call = etcdrpc.WatchStub(channel).Watch(self._idle(), metadata=metadata)

    def _idle(self) -> Iterator[Any]:
        self._stop.wait(self.LIFETIME)
        yield from ()

    def stale(self) -> bool:
        """The stream ended (a lost connection, a closed channel) a while after it was opened."""
        return bool(self._call.done()) and time.monotonic() - self._opened > self.REOPEN_PAUSE

    def close(self) -> None:
        """End the stream."""
        self._stop.set()
        self._call.cancel()
