"""The loop of a group's coordinator: what the :class:`~.arbiter.Arbiter` (generic groups) and
the :class:`~.steward.Steward` (incremental groups) share.

It runs on its own thread while its member leads the group's election, idle
otherwise. It follows the group's membership and the one record the
coordinator owns, and re-decides from their latest state after every change
(``_decide``). Every write of the record is fenced by the leadership and
compared with the version last seen, so a deposed coordinator changes
nothing: a conflict re-reads the record, a fenced write ends the leadership
until the election names this member again.

A deadline it gives the members (``rebalance_timeout``) is not their fault if
the store did not serve them meanwhile: a member left out for that would keep
running what it owns while the group hands it to another. So a deadline counts
from the moment the store last came back at the earliest (``_counted_from``:
this session's reconnection, or the first step after one that could not reach
the store), and a member is left out only once the deadline passed and the
store answered a read at once (``_store_answers_promptly``), which then also
holds every write that completed before it.
"""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Generic, Protocol, TypeVar

from consensus_api.coordinator.generic.loop import Mirror, StepThread, value_mirror
from consensus_api.errors import (
    BackendUnavailableError,
    FencedError,
    KeyExistsError,
    KeyNotFoundError,
    OperationTimeoutError,
    VersionConflictError,
)
from consensus_api.membership import GroupMembership
from consensus_api.model import Leadership, MembershipChanged, SessionState, ValueChanged
from consensus_api.storage import Storage

if TYPE_CHECKING:
    from consensus_api._session_port import SessionPort

#: Seconds between steps when nothing wakes the loop.
IDLE = 1.0
#: Seconds within which the store must answer the read that precedes leaving a member out.
PROMPT = 1.0


class Record(Protocol):
    def encode(self) -> bytes: ...


R = TypeVar("R", bound=Record)


class ElectedRunner(ABC, Generic[R]):
    """Runs ``_decide`` while its member leads the election of group ``root`` (``lead``)."""

    def __init__(
        self, session: SessionPort, name: str, root: str, key: str, decode: Callable[[bytes], R | None]
    ) -> None:
        self._session = session
        self._storage = Storage(session)
        self._root = root
        self._key = key
        self._decode = decode
        self._lock = threading.Lock()
        self._leadership: Leadership | None = None
        self._thread = StepThread(name, self._step, self._stop_mirrors)
        self._members: Mirror[MembershipChanged] | None = None
        self._record: Mirror[ValueChanged] | None = None
        self._known: tuple[R | None, int | None] = (None, None)
        self._connected_at = time.monotonic()
        self._cut_off = False  # the last step could not reach the store
        session.add_state_listener(self._on_state)

    def lead(self, leadership: Leadership | None) -> None:
        """This member leads (``leadership``) or does not (None). Any thread."""
        with self._lock:
            self._leadership = leadership
        if leadership is not None:
            self._thread.start()
        self._thread.wake()

    def stop(self) -> None:
        """Stop for good; waits at most the session's ``request_timeout``."""
        self._session.remove_state_listener(self._on_state)
        self._thread.stop(self._session.settings.request_timeout)

    def _on_state(self, state: SessionState) -> None:
        if state is SessionState.CONNECTED:
            self._connected_at = time.monotonic()
            self._thread.wake()

    def _counted_from(self, started: float) -> float:
        """When a members' deadline begun at ``started`` (``time.monotonic()``) starts to count: not
        before the store last came back."""
        return max(started, self._connected_at)

    def _store_answers_promptly(self) -> bool:
        """Read the record linearizably: True if the store answered within ``PROMPT`` seconds; else
        False, and the members' deadlines count again from now (the store was stalled or cut off)."""
        started = time.monotonic()
        self._storage.fetch(self._key)
        if time.monotonic() - started <= PROMPT:
            return True
        self._connected_at = time.monotonic()
        return False

    @abstractmethod
    def _decide(
        self, leadership: Leadership, members: MembershipChanged, record: R | None, version: int | None
    ) -> float:
        """One step as the leader: the record (None if absent) at ``version``; returns the seconds
        until the next step at the latest."""

    @abstractmethod
    def _release(self) -> None:
        """Stop following what ``_decide`` follows beyond the membership and the record."""

    def _step(self) -> float:
        with self._lock:
            leadership = self._leadership
        if leadership is None:
            self._stop_mirrors()
            return IDLE
        members, record = self._start_mirrors()
        if members is None or record is None:
            return IDLE  # the first events wake us
        known, version = self._latest(record)
        if self._cut_off:
            self._connected_at, self._cut_off = time.monotonic(), False
        try:
            return self._decide(leadership, members, known, version)
        except (OperationTimeoutError, BackendUnavailableError):
            self._cut_off = True
            raise

    def _latest(self, mirror: Mirror[ValueChanged]) -> tuple[R | None, int | None]:
        event = mirror.event
        known, known_version = self._known
        if event is not None and event.version is not None and (known_version or -1) < event.version:
            assert event.value is not None
            known, known_version = self._decode(event.value), event.version
            self._known = (known, known_version)
        return known, known_version

    def _write(self, lead: Leadership, record: R, version: int | None) -> None:
        """Store ``record`` if the stored one is still at ``version`` (None: absent) and ``lead``
        still holds."""
        storage = self._storage
        try:
            if version is None:
                written = storage.put(self._key, record.encode(), fence=lead)
            else:
                written = storage.update(self._key, record.encode(), version=version, fence=lead)
        except (VersionConflictError, KeyExistsError, KeyNotFoundError):
            stored = storage.fetch(self._key)
            self._known = (self._decode(stored.value), stored.version) if stored else (None, None)
            return
        except FencedError:
            with self._lock:
                if self._leadership == lead:
                    self._leadership = None
            return
        self._known = (record, written)

    def _start_mirrors(self) -> tuple[MembershipChanged | None, Mirror[ValueChanged] | None]:
        if self._members is None:
            group = GroupMembership(self._session, self._root)
            self._members = Mirror(group.add_listener, group.remove_listener, self._thread.wake)
            self._members.start()
        if self._record is None:
            self._record = value_mirror(self._session, self._key, self._thread.wake)
            self._record.start()
        return self._members.event, self._record if self._record.event is not None else None

    def _stop_mirrors(self) -> None:
        for mirror in (self._members, self._record):
            if mirror is not None:
                mirror.stop()
        self._members = self._record = None
        self._release()
        self._known = (None, None)
