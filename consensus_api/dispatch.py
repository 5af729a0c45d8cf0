"""The session's dispatcher thread: the only thread that runs user callbacks.

Guarantees: tasks run one at a time in submission order (delayed tasks when
due), except that urgent tasks (session state changes) run before every
ordinary task still waiting, in their own submission order; a task that
raises is logged and does not stop the thread; ``stop`` returns within its
timeout.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable

log = logging.getLogger("consensus_api")

Task = Callable[[], None]


class Dispatcher:
    """A single worker thread with a FIFO queue and a timer heap."""

    def __init__(self, name: str) -> None:
        self._cond = threading.Condition()
        self._queue: deque[Task] = deque()
        self._urgent: deque[Task] = deque()
        self._timers: list[tuple[float, int, Task]] = []
        self._sequence = itertools.count()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=f"consensus-dispatch-{name}", daemon=True)
        self._thread.start()

    def submit(self, task: Task) -> None:
        """Run ``task`` on the dispatcher thread after what is already queued."""
        with self._cond:
            if not self._stopping:
                self._queue.append(task)
                self._cond.notify()

    def submit_urgent(self, task: Task) -> None:
        """Run ``task`` on the dispatcher thread before the ordinary tasks still waiting."""
        with self._cond:
            if not self._stopping:
                self._urgent.append(task)
                self._cond.notify()

    def submit_later(self, delay: float, task: Task) -> None:
        """Run ``task`` on the dispatcher thread after ``delay`` seconds."""
        with self._cond:
            if not self._stopping:
                due = time.monotonic() + delay
                heapq.heappush(self._timers, (due, next(self._sequence), task))
                self._cond.notify()

    def on_dispatch_thread(self) -> bool:
        """True when called from the dispatcher thread itself."""
        return threading.current_thread() is self._thread

    def stop(self, timeout: float) -> None:
        """Run what is queued (not timers), then end the thread; waits at most ``timeout``."""
        with self._cond:
            self._stopping = True
            self._timers.clear()
            self._cond.notify()
        if not self.on_dispatch_thread():
            self._thread.join(timeout)

    def _next_task(self) -> Task | None:
        with self._cond:
            while True:
                now = time.monotonic()
                while self._timers and self._timers[0][0] <= now:
                    self._queue.append(heapq.heappop(self._timers)[2])
                if self._urgent:
                    return self._urgent.popleft()
                if self._queue:
                    return self._queue.popleft()
                if self._stopping:
                    return None
                wait = self._timers[0][0] - now if self._timers else None
                self._cond.wait(wait)

    def _run(self) -> None:
        while (task := self._next_task()) is not None:
            try:
                task()
            except Exception:
                log.exception("a listener callback raised; delivery continues")
