"""Building blocks of the coordinators: a stepping thread, listener mirrors, a member's seat.

:class:`StepThread` calls ``step()`` whenever woken, or after the delay the
last step asked for; a step that raises a ``ConsensusError`` is logged and
retried after ``RETRY_DELAY``. :class:`Mirror` keeps the latest event of one
listener (delivered on the session's dispatcher thread) and wakes its owner.
Owners read mirrors and re-decide from the latest state (level-triggered), so
a coalesced or late event never loses a change. :class:`Seat` is a member's
membership and candidacy in its group, and runs the group's coordinator
(:class:`~consensus_api.coordinator.elected.ElectedRunner`) while it leads.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from consensus_api.errors import ConsensusError, KeyExistsError, MemberExistsError, NotAMemberError
from consensus_api.model import KeySetChanged, LeaderChanged, Leadership, ValueChanged

if TYPE_CHECKING:
    from consensus_api.coordinator.elected import ElectedRunner
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


def value_mirror(session: Session, key: str, wake: Callable[[], None]) -> Mirror[ValueChanged]:
    """A mirror (not started) of the value of ``key``."""
    listeners = session.listeners
    add, remove = listeners.add_value_listener, listeners.remove_value_listener
    return Mirror(partial(add, key), partial(remove, key), wake)


def keyset_mirror(session: Session, namespace: str, wake: Callable[[], None]) -> Mirror[KeySetChanged]:
    """A mirror (not started) of the keys under ``namespace``."""
    listeners = session.listeners
    add, remove = listeners.add_keyset_listener, listeners.remove_keyset_listener
    return Mirror(partial(add, namespace), partial(remove, namespace), wake)


def store(session: Session, key: str, value: bytes) -> None:
    """Make ``value`` the value of ``key``, creating or replacing it (for keys only this member writes)."""
    try:
        session.storage.put(key, value)
    except KeyExistsError:
        session.storage.update(key, value)


#: How many members of a group stand as candidates of its election (the smallest member ids).
CANDIDATES = 3


class Seat:
    """One member's place in a coordinated group ``root``: its membership, its candidacy in the
    election of the same name, and the ``runner`` (the group's coordinator) it runs while it leads.

    Only the ``CANDIDATES`` smallest member ids stand, a few standbys giving failover without an
    election as large as the group; while nobody leads, every member tries again to stand
    (``wake`` asks the owner's thread to ``take`` the seat), so the group never stays leaderless.
    """

    def __init__(
        self,
        session: Session,
        root: str,
        member_id: str,
        runner: ElectedRunner[Any],
        wake: Callable[[], None],
    ) -> None:
        self._session = session
        self._root = root
        self._id = member_id
        self._runner = runner
        self._wake = wake
        self._membership = session.group(root)
        self._election = session.election(root)
        self._registered = False
        self._leaderless = True

    def take(self, data: Callable[[], bytes]) -> bool:
        """Join the group with ``data()`` unless joined, then stand if nobody leads. False (call
        again later) while a stale holder of the member id, such as this member before a session
        loss, has not expired yet. Called on the owner's thread."""
        if not self._registered:
            self._election.add_listener(self._on_leader)
            self._registered = self._join(data())
            if not self._registered:
                return False
        if self._leaderless:
            self._stand()
        return True

    def lost(self) -> None:
        """The session was lost: the membership is void, ``take`` joins again."""
        self._registered = False

    def close(self) -> None:
        """Stop the runner, then resign and leave (best effort: each step is tried, failures are
        logged)."""
        self._runner.stop()
        self._election.remove_listener(self._on_leader)
        leaves: list[Callable[[str], None]] = [self._election.resign, self._membership.leave]
        for leave in leaves:
            try:
                leave(self._id)
            except NotAMemberError:
                pass
            except Exception as exc:
                log.info("leaving group %r failed (%s)", self._root, exc)

    def _join(self, data: bytes) -> bool:
        try:
            if not self._session._holds_member(self._root, self._id):
                self._membership.join(self._id, data)
        except MemberExistsError:
            log.info("member %s of %r still held by an expiring session; retrying", self._id, self._root)
            return False
        return True

    def _stand(self) -> None:
        if self._session._holds_candidacy(self._root, self._id):
            return
        if self._id in sorted(self._membership.members())[:CANDIDATES]:
            try:
                self._election.nominate(self._id)
            except MemberExistsError:
                log.info(
                    "candidate %s of %r still held by an expiring session; retrying", self._id, self._root
                )

    def _on_leader(self, event: LeaderChanged) -> None:
        self._leaderless = event.leader_id is None
        if event.leader_id == self._id and event.term is not None:
            self._runner.lead(Leadership(event.service, self._id, event.term))
        else:
            self._runner.lead(None)
        if self._leaderless:
            self._wake()  # stand as a candidate if among the first
