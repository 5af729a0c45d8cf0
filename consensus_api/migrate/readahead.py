"""Reading the source ahead of the writes: batches from a thread, through a bounded queue."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")

#: How long the reader waits to hand over a batch before checking whether it should stop.
HANDOVER = 0.2


class _Done:
    pass


class _Failed:
    def __init__(self, error: BaseException) -> None:
        self.error = error


class ReadAhead(Generic[T]):
    """Iterates ``items`` on a thread, ``depth`` batches of ``size`` ahead of the consumer.

    Iterating the object yields the batches in order and re-raises what the
    reader raised; ``close`` (also on leaving a ``with`` block) stops the reader.
    """

    def __init__(self, items: Iterable[T], size: int, depth: int = 4) -> None:
        self._items = items
        self._size = size
        self._queue: queue.Queue[list[T] | _Done | _Failed] = queue.Queue(depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, name="consensus-migrate-read", daemon=True)
        self._thread.start()

    def __enter__(self) -> ReadAhead[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[list[T]]:
        while True:
            batch = self._queue.get()
            if isinstance(batch, _Done):
                return
            if isinstance(batch, _Failed):
                raise batch.error
            yield batch

    def close(self) -> None:
        """Stop the reader (it ends at its next batch boundary; it is a daemon thread)."""
        self._stop.set()

    def _read(self) -> None:
        try:
            batch: list[T] = []
            for item in self._items:
                batch.append(item)
                if len(batch) >= self._size:
                    if not self._hand_over(batch):
                        return
                    batch = []
            if batch and not self._hand_over(batch):
                return
            self._hand_over(_Done())
        except BaseException as exc:
            self._hand_over(_Failed(exc))

    def _hand_over(self, item: list[T] | _Done | _Failed) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=HANDOVER)
                return True
            except queue.Full:
                continue
        return False
