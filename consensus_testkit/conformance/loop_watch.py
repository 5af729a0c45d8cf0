"""Telling a blocked event loop from a starved machine, for the ``aio`` section.

asyncio's debug mode reports every task step that took longer than
``slow_callback_duration``. A step also takes long when the process cannot
run: its loop thread waits for a CPU, or for the GIL while the thread holding
it waits for a CPU. :class:`StepWatch` times the loop on a clock that stops
while the loop's thread waits on a run queue (Linux ``schedstat``), and drops a
report when the other threads' run-queue waits during the step (sampled) bring
it under the threshold. A blocking call sleeps in the kernel, which is not a
run-queue wait, so it is still reported. Without ``schedstat`` every report stands.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path

TASKS = Path("/proc/self/task")
#: How often the sampler reads every thread's run-queue wait.
SAMPLE_EVERY = 0.01
#: Samples kept (seconds of history: SAMPLE_EVERY * HISTORY).
HISTORY = 3000

log = logging.getLogger(__name__)


def _wait(stats: Path) -> int:
    """The run-queue wait in ``stats`` (a ``schedstat`` file), in nanoseconds."""
    return int(stats.read_text().split()[1])


def run_queue_waits() -> dict[int, int]:
    """Nanoseconds each live thread of this process has waited for a CPU; empty where not on Linux."""
    waits = {}
    with contextlib.suppress(OSError):
        for task in os.scandir(TASKS):
            with contextlib.suppress(OSError, ValueError, IndexError):
                waits[int(task.name)] = _wait(Path(task.path, "schedstat"))
    return waits


class StepWatch(logging.Filter):
    """Times a loop's task steps without its thread's waits for a CPU (``watching``) and, as a filter
    on the ``asyncio`` logger, drops the slow-step reports the other threads' waits explain."""

    def __init__(self, threshold: float) -> None:
        super().__init__()
        self.threshold = threshold
        self._times: deque[float] = deque(maxlen=HISTORY)
        self._samples: deque[dict[int, int]] = deque(maxlen=HISTORY)
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample, name="consensus-step-watch", daemon=True)
        self._loop_thread = 0

    def _sample(self) -> None:
        while not self._stop.wait(SAMPLE_EVERY):
            self._record()

    def _record(self) -> dict[int, int]:
        waits, now = run_queue_waits(), time.monotonic()
        self._times.append(now)
        self._samples.append(waits)
        return waits

    def waited(self, seconds: float) -> float:
        """Seconds the other threads (not the loop's, not the sampler) waited for a CPU within the
        last ``seconds``, from the first sample inside them: a wait before a late sample is left
        out, never one from before the step counted."""
        end = self._record()
        times = list(self._times)
        start = self._samples[bisect.bisect_left(times, times[-1] - seconds)]
        for tid in (self._sampler.native_id, self._loop_thread):
            end.pop(tid or 0, None)
        return sum(max(wait - start.get(tid, wait), 0) for tid, wait in end.items()) / 1e9

    def filter(self, record: logging.LogRecord) -> bool:
        """Keep every record but a slow-step report explained by waiting for a CPU."""
        if not (record.getMessage().startswith("Executing <Task") and isinstance(record.args, tuple)):
            return True
        took = record.args[-1]
        if not isinstance(took, float):
            return True
        waited = self.waited(took)
        if took - waited >= self.threshold:
            return True
        log.info("a task step took %.3f s, %.3f s of it waiting for a CPU: not a blocked loop", took, waited)
        return False

    @contextlib.contextmanager
    def watching(self, loop: asyncio.AbstractEventLoop) -> Iterator[None]:
        """Report ``loop``'s steps over the threshold while inside."""
        loop.slow_callback_duration = self.threshold
        if not run_queue_waits():
            yield
            return
        self._loop_thread = threading.get_native_id()
        own = TASKS / str(self._loop_thread) / "schedstat"
        plain, base, last = loop.time, _wait(own), 0.0

        def running_clock() -> float:
            nonlocal last
            waited = _wait(own) - base  # read first: a wait after it shows in neither reading
            last = max(last, plain() - waited / 1e9)
            return last

        loop.time = running_clock  # type: ignore[method-assign]  # for good: timers were set on it
        asyncio_log = logging.getLogger("asyncio")
        asyncio_log.addFilter(self)
        self._record()
        self._sampler.start()
        try:
            yield
        finally:
            self._stop.set()  # not joined: that would hold the loop up to a sample's end
            asyncio_log.removeFilter(self)
