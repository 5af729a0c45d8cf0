"""The fault tests' prober: a thread that keeps calling a session's API during a fault and times
every call (``Prober``), for ``test_faults`` and the worker process (``worker.py``)."""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from consensus_api.errors import ConsensusError
from consensus_api.model import Versioned
from consensus_api.session import Session

#: How much longer than its ``request_timeout`` a call may block during a fault.
CALL_SLACK = 1.0


@dataclass
class Call:
    """One API call made during a fault: what, when it started (``time.monotonic()``), how long, and
    how it ended."""

    name: str
    started: float
    seconds: float
    outcome: str


#: A prober's calls, one of each per cycle.
PROBE_CALLS = frozenset({"put", "fetch", "keys", "membership", "leadership"})
#: The pause between two cycles of calls.
CYCLE_PAUSE = 0.05


class Prober:
    """A thread that keeps calling a session's API during a fault and times every call.

    It cycles through ``put`` (a new key each time: the acknowledged ones are
    kept in ``acked``), ``fetch``, ``keys``, ``membership`` and ``leadership``.
    The test marks the fault with ``fault_begins`` and ``fault_ends``;
    ``finish`` waits until every kind of call succeeded after the fault, stops
    the thread and asserts that it never raised anything but a
    ``ConsensusError`` (else: its traceback), that no call blocked longer than
    ``request_timeout + CALL_SLACK`` and that it kept calling through the
    fault: no call may last longer than that limit, so a fault of ``d`` seconds
    saw at least ``1 + d // (limit + CYCLE_PAUSE)`` calls in progress
    (``expected_calls``).
    """

    def __init__(self, session: Session, namespace: str, group: str, service: str) -> None:
        self.session = session
        self.limit = session.settings.request_timeout + CALL_SLACK
        self.calls: list[Call] = []
        self.acked: dict[str, Versioned] = {}
        #: The traceback of what ended the thread other than ``stop``, if anything did.
        self.crash: str | None = None
        self._namespace = namespace
        self._group = group
        self._service = service
        self._stop = threading.Event()
        self._current = ("no call", time.monotonic())
        self._fault: list[float] = []
        self._thread = threading.Thread(target=self._run, name="ct-prober", daemon=True)

    def __enter__(self) -> Prober:
        return self.start()

    def start(self) -> Prober:
        """Start calling; ``stop`` ends it."""
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        if kind is None:
            self.stop()
        else:
            self._stop.set()  # the test failed already: report that, not a slow call

    def fault_begins(self) -> float:
        """Mark the start of the fault; returns that moment (``time.monotonic()``)."""
        self._fault = [time.monotonic()]
        return self._fault[0]

    def fault_ends(self) -> float:
        """Mark the end of the fault; returns that moment (``time.monotonic()``)."""
        assert len(self._fault) == 1, "fault_ends without fault_begins"
        self._fault.append(time.monotonic())
        return self._fault[1]

    def stop(self) -> None:
        """End the thread (waits at most one call's limit); fails if a call stayed blocked or the
        thread raised."""
        self._stop.set()
        self._thread.join(self.limit + 1)
        if self._thread.is_alive():
            name, started = self._current
            raise AssertionError(
                f"{name} has been blocked for {time.monotonic() - started:.1f}s, more than request_timeout "
                f"+ {CALL_SLACK:g}s ({self.limit:g}s); the calls before it: {self.calls[-4:]}"
            )
        self._check_alive()

    def _check_alive(self) -> None:
        assert self.crash is None, f"the prober thread died after {len(self.calls)} calls:\n{self.crash}"

    def _run(self) -> None:
        try:
            self._cycle()
        except BaseException:  # anything but a ConsensusError fails the test, with its traceback
            self.crash = traceback.format_exc()

    def _cycle(self) -> None:
        storage = self.session.storage
        index = 0
        while not self._stop.is_set():
            key = f"{self._namespace}/probe-{index}"
            value = f"probe-{index}".encode()
            version = self._timed("put", lambda: storage.put(key, value))  # noqa: B023 - called at once
            if isinstance(version, int):
                self.acked[key] = Versioned(value, version)
            self._timed("fetch", lambda: storage.fetch(key))  # noqa: B023
            self._timed("keys", lambda: storage.keys(self._namespace))
            self._timed("membership", lambda: self.session.group(self._group).membership())
            self._timed("leadership", lambda: self.session.election(self._service).leadership())
            index += 1
            self._stop.wait(CYCLE_PAUSE)

    def _timed(self, name: str, call: Callable[[], Any]) -> Any:
        if self._stop.is_set():
            return None  # stopping: only the call in progress may still run
        start = time.monotonic()
        self._current = (name, start)
        try:
            result = call()
            outcome = "ok"
        except ConsensusError as exc:
            result, outcome = None, type(exc).__name__
        self.calls.append(Call(name, start, time.monotonic() - start, outcome))
        return result

    def longest(self) -> float:
        """The longest call so far, in seconds."""
        return max((call.seconds for call in self.calls), default=0.0)

    @property
    def fault(self) -> tuple[float, float]:
        """When the fault began and ended (``time.monotonic()``), as marked."""
        assert len(self._fault) == 2, "the fault was not marked (fault_begins, fault_ends)"
        return self._fault[0], self._fault[1]

    def during(self) -> list[Call]:
        """The calls in progress at some moment between ``fault_begins`` and ``fault_ends``."""
        begun, ended = self.fault
        return [call for call in self.calls if call.started <= ended and call.started + call.seconds >= begun]

    def succeeded_after(self) -> set[str]:
        """The kinds of call that succeeded at least once after ``fault_ends``."""
        ended = self.fault[1]
        return {call.name for call in list(self.calls) if call.started >= ended and call.outcome == "ok"}

    def expected_calls(self) -> int:
        """How many calls must have been in progress during the fault, at the least, if the prober kept
        calling: one call, and one more for each full ``request_timeout + CALL_SLACK`` (the longest a
        call may block) plus the pause between cycles that the fault lasted."""
        begun, ended = self.fault
        return 1 + int((ended - begun) // (self.limit + CYCLE_PAUSE))

    def finish(self, bound: float) -> None:
        """Wait (at most ``bound``) until every kind of call succeeded after the fault, stop, and assert
        that the thread never raised, no call blocked too long and the prober kept calling through the
        fault (``expected_calls``)."""
        deadline = time.monotonic() + bound
        while self.succeeded_after() != PROBE_CALLS and self._thread.is_alive():
            assert time.monotonic() < deadline, (
                f"after the fault, within {bound:g}s, only {sorted(self.succeeded_after())} of "
                f"{sorted(PROBE_CALLS)} succeeded; the last calls: {self.calls[-5:]}"
            )
            time.sleep(0.05)
        self.stop()
        self.check()
        during = self.during()
        expected = self.expected_calls()
        assert len(during) >= expected, (
            f"{len(during)} prober calls ran during the fault of {self.fault[1] - self.fault[0]:.1f}s, fewer "
            f"than {expected}: "
            f"the prober was not calling; its calls: {self.calls[-8:]}"
        )

    def check(self) -> None:
        """Assert that the thread never raised and no call blocked longer than ``request_timeout +
        CALL_SLACK``."""
        self._check_alive()
        slow = [call for call in self.calls if call.seconds > self.limit]
        assert not slow, (
            f"calls blocked longer than request_timeout + {CALL_SLACK:g}s ({self.limit:g}s): {slow}"
        )

    def failures(self) -> set[str]:
        """The names of the errors calls raised."""
        return {call.outcome for call in self.calls if call.outcome != "ok"}
