"""Building blocks of the generic machinery: a stepping thread, listener mirrors, a storing write.

:class:`StepThread` calls ``step()`` whenever woken, or after the delay the
last step asked for; a step that raises a ``ConsensusError`` is logged and
retried after ``RETRY_DELAY``. :class:`Mirror` keeps the latest event of one
listener (delivered on the session's dispatcher thread) and wakes its owner.
Owners read mirrors and re-decide from the latest state (level-triggered), so
a coalesced or late event never loses a change.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from consensus_api.backend import Target, TargetKind
from consensus_api.errors import ConsensusError, KeyExistsError
from consensus_api.model import KeySetChanged, ValueChanged
from consensus_api.storage import Storage

if TYPE_CHECKING:
    from consensus_api._session_port import SessionPort

log = logging.getLogger("consensus_api.coordinator")

RETRY_DELAY = 0.25
E = TypeVar("E")
Callback = Callable[[Any], None]


class StepThread:
    """A daemon thread running ``step`` (returns the seconds until it wants to run again)."""

    def __init__(
        self, name: str, step: Callable[[], float], finish: Callable[[], None] | None = None
    ) -> None:
        self._step = step
        self._finish = finish
        self._cond = threading.Condition()
        self._woken = False
        self._stopping = False
        self._started = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    @property
    def started(self) -> bool:
        """True once ``start`` was called."""
        return self._started

    @property
    def stopping(self) -> bool:
        """True once ``stop`` was called."""
        return self._stopping

    def start(self) -> None:
        """Start the thread (once)."""
        with self._cond:
            if self._started:
                return
            self._thread.start()  # the thread waits for this lock before its first step
            self._started = True

    def wake(self) -> None:
        """Step soon. Any thread; never blocks."""
        with self._cond:
            self._woken = True
            self._cond.notify()

    def current(self) -> bool:
        """True when called on this thread."""
        return threading.current_thread() is self._thread

    def stop(self, timeout: float) -> None:
        """End the loop after the current step, run ``finish``; wait at most ``timeout`` for it."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._started and not self.current():
            self._thread.join(timeout)

    def join(self, timeout: float) -> None:
        """Wait at most ``timeout`` for the thread to end."""
        if self._started and not self.current():
            self._thread.join(timeout)

    def _run(self) -> None:
        try:
            delay = 0.0
            while True:
                with self._cond:
                    if not self._woken and not self._stopping and delay > 0:
                        self._cond.wait(delay)
                    self._woken = False
                    if self._stopping:
                        return
                started = time.monotonic()
                try:
                    delay = self._step()
                except ConsensusError as exc:
                    log.info("%s: step failed (%s); retrying", self._thread.name, exc)
                    delay = RETRY_DELAY
                except Exception:
                    log.exception("%s: step failed; retrying", self._thread.name)
                    delay = RETRY_DELAY
                if delay <= 0 and time.monotonic() - started < 0.001:
                    delay = 0.001  # never spin
        finally:
            if self._finish is not None:
                try:
                    self._finish()
                except Exception:
                    log.exception("%s: finishing failed", self._thread.name)


class Mirror(Generic[E]):
    """The latest event of one listener registration; ``event`` is None until the first arrives."""

    def __init__(
        self,
        add: Callable[[Callback], None],
        remove: Callable[[Callback], None],
        wake: Callable[[], None],
    ) -> None:
        self._add = add
        self._remove = remove
        self._wake = wake
        self._lock = threading.Lock()
        self._event: E | None = None
        self._active = False

    @property
    def event(self) -> E | None:
        """The latest event delivered, or None."""
        with self._lock:
            return self._event

    def start(self) -> None:
        """Register the listener (its first event reports the current state)."""
        with self._lock:
            if self._active:
                return
            self._active = True
        self._add(self._on_event)

    def stop(self) -> None:
        """Unregister the listener and forget the event."""
        with self._lock:
            if not self._active:
                return
            self._active = False
            self._event = None
        try:
            self._remove(self._on_event)
        except ConsensusError as exc:
            log.debug("removing a listener failed (%s)", exc)

    def _on_event(self, event: E) -> None:
        with self._lock:
            if not self._active:
                return
            self._event = event
        self._wake()


def value_mirror(session: SessionPort, key: str, wake: Callable[[], None]) -> Mirror[ValueChanged]:
    """A mirror (not started) of the value of ``key``."""
    target = Target(TargetKind.VALUE, key)
    return Mirror(partial(session.add_listener, target), partial(session.remove_listener, target), wake)


def keyset_mirror(session: SessionPort, namespace: str, wake: Callable[[], None]) -> Mirror[KeySetChanged]:
    """A mirror (not started) of the keys under ``namespace``."""
    target = Target(TargetKind.KEYSET, namespace)
    return Mirror(partial(session.add_listener, target), partial(session.remove_listener, target), wake)


def store(storage: Storage, key: str, value: bytes) -> None:
    """Make ``value`` the value of ``key``, creating or replacing it (for keys only this member writes)."""
    try:
        storage.put(key, value)
    except KeyExistsError:
        storage.update(key, value)
