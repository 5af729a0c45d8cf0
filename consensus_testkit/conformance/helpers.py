"""Helpers of the conformance suite: event recording, bounded waits and unique names.

Nothing here imports pytest, so child processes (``worker.py``) can use it too.
Every wait is bounded and fails with an ``AssertionError`` that says what was
awaited and lists what arrived instead.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

from consensus_api.backend import Backend
from consensus_api.session import Session

T = TypeVar("T")
R = TypeVar("R")

#: How long a test waits for an event that needs no failure detection.
EVENT_TIMEOUT = 15.0

#: How long a test lets a callback run late before it concludes that no event will come.
QUIET_PERIOD = 0.3

#: Threads that run user callbacks are named ``consensus-dispatch-<backend>``.
DISPATCH_THREAD_PREFIX = "consensus-dispatch"


class SessionFactory(Protocol):
    """``consensus_open_session(**options)``: a new session with the suite's defaults; closed at teardown."""

    def __call__(self, **options: Any) -> Session: ...


def unique(prefix: str = "ct") -> str:
    """A name nobody else uses: ``<prefix>-<16 hex digits>`` (a valid key segment)."""
    return f"{prefix}-{uuid.uuid4().hex[:16]}"


def spi(session: Session) -> Backend:
    """The backend behind ``session``, for the tests of SPI calls that only the core and the migration
    tools make (``seal``, ``term_ceiling``, ``live_sessions``); not part of the public API."""
    return session._backend


def loss_timeout(session_timeout: float) -> float:
    """The bound on noticing a dead or paused session: three session timeouts plus 10 s."""
    return session_timeout * 3 + 10


def describe(items: list[Any], limit: int = 40) -> str:
    """A readable, bounded listing of ``items`` (the last ``limit`` of them)."""
    if not items:
        return "nothing arrived"
    shown = items[-limit:]
    skipped = len(items) - len(shown)
    lines = [f"  [{index}] {item!r}" for index, item in enumerate(shown, start=skipped)]
    head = f"{len(items)} arrived" + (f" (the first {skipped} not shown)" if skipped else "")
    return head + ":\n" + "\n".join(lines)


class EventLog(Generic[T]):
    """A thread-safe recorder of callback events, usable as the callback itself.

    Records each event with the name of the thread that delivered it.
    """

    def __init__(self, name: str = "events") -> None:
        self.name = name
        self._cond = threading.Condition()
        self._events: list[T] = []
        self._threads: list[str] = []

    def __call__(self, event: T) -> None:
        with self._cond:
            self._events.append(event)
            self._threads.append(threading.current_thread().name)
            self._cond.notify_all()

    def __len__(self) -> int:
        with self._cond:
            return len(self._events)

    def __repr__(self) -> str:
        return f"<EventLog {self.name}: {len(self)} events>"

    @property
    def events(self) -> list[T]:
        """A copy of every event so far, in arrival order."""
        with self._cond:
            return list(self._events)

    @property
    def threads(self) -> list[str]:
        """The names of the threads that delivered each event."""
        with self._cond:
            return list(self._threads)

    def wait_for(
        self,
        predicate: Callable[[T], bool],
        timeout: float = EVENT_TIMEOUT,
        *,
        since: int = 0,
        what: str = "a matching event",
    ) -> T:
        """The first event at index ``since`` or later that satisfies ``predicate``."""
        return self._wait(lambda: self._first(predicate, since), timeout, what)

    def wait_index(
        self,
        predicate: Callable[[T], bool],
        timeout: float = EVENT_TIMEOUT,
        *,
        since: int = 0,
        what: str = "a matching event",
    ) -> int:
        """The index of the first event at ``since`` or later that satisfies ``predicate``."""

        def find() -> int | None:
            for index in range(since, len(self._events)):
                if predicate(self._events[index]):
                    return index
            return None

        return self._wait(find, timeout, what)

    def wait_count(self, count: int, timeout: float = EVENT_TIMEOUT) -> list[T]:
        """The first ``count`` events, once that many arrived."""
        return self._wait(
            lambda: list(self._events[:count]) if len(self._events) >= count else None,
            timeout,
            f"at least {count} event(s)",
        )

    def wait_last(
        self, predicate: Callable[[T], bool], timeout: float = EVENT_TIMEOUT, *, what: str = "the last event"
    ) -> T:
        """The latest event, once the latest event satisfies ``predicate`` (convergence)."""

        def last() -> T | None:
            if self._events and predicate(self._events[-1]):
                return self._events[-1]
            return None

        return self._wait(last, timeout, what)

    def _first(self, predicate: Callable[[T], bool], since: int) -> T | None:
        for event in self._events[since:]:
            if predicate(event):
                return event
        return None

    def _wait(self, find: Callable[[], R | None], timeout: float, what: str) -> R:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                found = find()
                if found is not None:
                    return found
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(
                        f"{self.name}: timed out after {timeout:.1f}s waiting for {what}; "
                        f"{describe(self._events)}"
                    )
                self._cond.wait(remaining)


def wait_until(
    predicate: Callable[[], R | None],
    timeout: float = EVENT_TIMEOUT,
    *,
    what: str = "the condition holds",
    interval: float = 0.05,
    observe: Callable[[], object] | None = None,
) -> R:
    """Poll ``predicate`` until it returns a truthy value, and return that value.

    Fails after ``timeout`` seconds; the message shows ``observe()`` (or the
    last value of ``predicate``) so the reader sees what was there instead.
    """
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() >= deadline:
            seen = observe() if observe is not None else result
            raise AssertionError(
                f"timed out after {timeout:.1f}s waiting until {what}; last observed: {seen!r}"
            )
        time.sleep(interval)


def quiet_period(control: Callable[[], object]) -> None:
    """The wait before a negative check ("nothing more arrived"), with a positive control: ``control()``
    causes an event on another target and waits until it arrived - delivery was flowing - then
    ``QUIET_PERIOD`` more passes for a late callback."""
    control()
    time.sleep(QUIET_PERIOD)


def stays_quiet(observe: Callable[[], object], window: float, *, what: str) -> None:
    """A negative check: ``observe()`` stays falsy for ``window`` seconds (polled), else the test fails
    naming ``what`` and the observation. Pair it with ``fires_within`` on the same observation in the
    same test: the positive control that shows ``window`` is long enough to see the thing happen."""
    deadline = time.monotonic() + window
    while time.monotonic() < deadline:
        seen = observe()
        assert not seen, f"{what}: {seen!r}"
        time.sleep(0.05)


def fires_within(observe: Callable[[], R | None], window: float, *, what: str) -> R:
    """The positive control of a ``stays_quiet`` check: when the thing does happen, ``observe()`` turns
    truthy within the same ``window`` (else the quiet window was too short to prove anything)."""
    started = time.monotonic()
    seen = wait_until(observe, window, what=f"{what} (positive control: the quiet window would miss it)")
    assert time.monotonic() - started <= window + 0.1
    return seen


def is_dispatch_thread(name: str) -> bool:
    """True for the name of a session's dispatcher thread."""
    return name.startswith(DISPATCH_THREAD_PREFIX)
