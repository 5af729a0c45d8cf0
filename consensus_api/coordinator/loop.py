"""Building blocks of the coordinators: a stepping thread, a listener mirror, registration.

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
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from consensus_api.errors import ConsensusError, MemberExistsError

if TYPE_CHECKING:
    from consensus_api.session import Session

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


#: How many members of a group stand as candidates of its election (the smallest member ids).
CANDIDATES = 3


def register(session: Session, name: str, member_id: str, data: bytes) -> bool:
    """Make ``member_id`` a member of group ``name`` in ``session``; True once it holds. False (try
    again later) while a stale holder of the id, such as this member before a session loss, has
    not expired yet."""
    try:
        if not session._holds_member(name, member_id):
            session.group(name).join(member_id, data)
    except MemberExistsError:
        log.info("member %s of %r still held by an expiring session; retrying", member_id, name)
        return False
    return True


def stand(session: Session, name: str, member_id: str) -> None:
    """Become a candidate of election ``name`` if ``member_id`` is among the ``CANDIDATES`` smallest
    ids of group ``name``: a few standbys give failover without an election as large as the group.
    Members call it again while nobody leads, so the group never stays leaderless."""
    if session._holds_candidacy(name, member_id):
        return
    if member_id in sorted(session.group(name).members())[:CANDIDATES]:
        try:
            session.election(name).nominate(member_id)
        except MemberExistsError:
            log.info("candidate %s of %r still held by an expiring session; retrying", member_id, name)
