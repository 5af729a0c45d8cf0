"""A bridged session's backend: one API over an old and a new store, sent to whichever has authority.

``consensus_api.connect(OLD, migrate_to=NEW)`` builds a ``BridgeBackend`` under an ordinary
session, so storage, listeners, groups, elections, locks and coordinators work unchanged. Each
side is a ``FloorBackend`` (``consensus_api.floor``). Authority follows the markers
(``consensus_api.marker``); the bridge watches them (and re-checks every ``RECHECK`` seconds).
When authority moves, the bridge closes the side it leaves (so every member and candidacy there
is released first), reports ``LOST`` to the core (leaders are told ``LeaderChanged(None)``, lock
holders ``LockLost``), watches everything on the side it arrives at, whose floor it has just read,
and reports ``CONNECTED``: the core re-joins members and re-nominates candidates there. A bridge
announces itself as a member of ``BRIDGED_GROUP`` on the store it uses.

Parking: once the old store's marker says a cut-over began, the bridge reports ``LOST`` and
announces itself ``parked``; until the cut-over ends it takes nothing and reads no leadership
(joins, nominations, leadership reads: ``SessionLostError``; fenced writes: ``FencedError``;
unfenced writes wait). The cut-over reads the old store's term ceiling once every bridged session
is parked: no term an application hears of afterwards can exceed the new store's floor.

Writes: a ``SealedError`` (the old store sealed) on an unfenced write waits for authority to move
and retries there within ``request_timeout``; on a fenced write it is a ``FencedError``."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

from consensus_api import bridge_metrics
from consensus_api.backend import Backend, BackendEvents, Target, TargetKind
from consensus_api.bridge_holdings import Holdings
from consensus_api.config import BackendURL, Options
from consensus_api.errors import (
    ConsensusError,
    FencedError,
    MemberExistsError,
    OperationTimeoutError,
    SealedError,
    SessionLostError,
)
from consensus_api.floor import MARKER_KEY, BackendFactory, FloorBackend
from consensus_api.marker import BRIDGED_GROUP, CUTOVER, NEW, OLD, Marker, announce, authority
from consensus_api.model import Leadership, SessionState, Versioned

__all__ = ["BRIDGED_GROUP", "BridgeBackend", "Marker"]

log = logging.getLogger("consensus_api.migrate")

#: Seconds between two checks of the markers when no change is reported.
RECHECK = 5.0
#: Seconds between two attempts to move when the arriving store cannot be reached.
RETRY = 0.5
#: Seconds a session none of whose candidates led waits before re-nominating on the arriving store,
#: so that the sessions whose candidates led re-nominate first (the old queue's head stays ahead).
REQUEUE_PAUSE = 0.5

_MARKER_TARGET = Target(TargetKind.VALUE, MARKER_KEY)
T = TypeVar("T")


class BridgeBackend(Backend):
    """The old and the new store as one backend (module docstring)."""

    def __init__(
        self,
        url: BackendURL,
        options: Options,
        events: BackendEvents,
        *,
        old_factory: BackendFactory,
        new_factory: BackendFactory,
        new_url: BackendURL,
        new_options: Options,
    ) -> None:
        super().__init__(url, options, events)
        self._stores = {OLD: (old_factory, url, options), NEW: (new_factory, new_url, new_options)}
        self._sides: dict[str, FloorBackend | None] = {OLD: self._built(OLD), NEW: None}
        self._authority = OLD
        self._moved = threading.Condition()
        self._watched: set[Target] = set()
        self._opened: list[FloorBackend] = []
        self._held = Holdings()
        self._announced_as: str | None = None
        self._closed = False
        self._kick = threading.Event()
        self._thread = threading.Thread(target=self._run, name="consensus-bridge", daemon=True)

    @property
    def authority(self) -> str:
        """``old`` or ``new``: the store this bridge now sends calls to."""
        return self._authority

    @property
    def active(self) -> FloorBackend:
        """The backend of the store with authority."""
        side = self._sides[self._authority]
        if side is None:
            raise SessionLostError("the bridged session is moving between stores")
        return side

    def _built(self, which: str) -> FloorBackend:
        factory, url, options = self._stores[which]
        return FloorBackend(
            factory,
            url,
            options,
            _Side(partial(self._on_side_state, which), partial(self._on_side_changed, which)),
        )

    def _side(self, which: str) -> FloorBackend:
        """The backend of store ``which``, opened (and its marker watched) on first use."""
        if self._closed:
            raise SessionLostError("the session is closed; open a new one with consensus_api.connect()")
        side = self._sides[which]
        if side is None:
            side = self._sides[which] = self._built(which)
        if side not in self._opened:
            side.open()
            side.watch(_MARKER_TARGET)
            self._opened.append(side)
        return side

    def _read_markers(self) -> tuple[str, bool]:
        """Who has authority, and whether a cut-over is under way (the new store's marker matters)."""
        old_marker = Marker.decode(self._side(OLD).fetch(MARKER_KEY))
        if old_marker is None or old_marker.phase != CUTOVER:
            return OLD, False
        return authority(old_marker, Marker.decode(self._side(NEW).fetch(MARKER_KEY))), True

    def _announce(self) -> None:
        side = self.active
        try:
            previous, self._announced_as = self._announced_as, None
            if previous is not None and previous in side.membership(BRIDGED_GROUP):
                side.leave(BRIDGED_GROUP, previous)
            self._announced_as = announce(side, parked=self._held.parked)
        except MemberExistsError:
            pass
        except ConsensusError as exc:
            log.warning("bridged session: could not announce itself (%s); retrying in %s s", exc, RECHECK)

    def _move(self, to: str) -> None:
        """Hand every call to the store ``to`` (module docstring)."""
        arriving = self._side(to)
        arriving.refresh_floor()
        leaving = self._sides[self._authority]
        queued_behind = leaving is not None and self._held.queued_behind(leaving)
        if leaving is not None:
            leaving.close()
            self._opened.remove(leaving)
        with self._moved:
            self._sides[self._authority] = None
            bridge_metrics.moved(self._authority, to)
            self._authority = to
            self._held.parked = False
            self._announced_as = None
        log.info("bridged session: authority moved to the %s store (%s)", to, arriving.url.redacted())
        self.events.state_changed(SessionState.LOST)
        for target in list(self._watched):
            arriving.watch(target)
        self._announce()
        if queued_behind:
            time.sleep(REQUEUE_PAUSE)  # the leaders re-nominate first: the old queue's head stays ahead
        self.events.state_changed(SessionState.CONNECTED)
        with self._moved:
            self._moved.notify_all()
        if self._sides[OLD] is None:
            self._side(OLD)  # the old store's marker is still the one to watch (a roll-back)

    def _run(self) -> None:
        while not self._closed:
            self._kick.wait(RECHECK)
            self._kick.clear()
            if self._closed:
                return
            try:
                to, cutting_over = self._read_markers()
                if to != self._authority:
                    self._move(to)
                elif cutting_over and to == OLD and not self._held.parked:
                    self._park()
                elif self._held.parked and not cutting_over:
                    self._unpark()
                elif not self._announced():
                    self._announce()
                if to == OLD and not cutting_over:
                    self._drop_new()
            except ConsensusError as exc:
                log.info("bridged session: checking authority failed (%s); retrying", exc)
                time.sleep(RETRY)  # then at the next report, or after RECHECK

    def _park(self) -> None:
        """A cut-over began: report ``LOST``, give up what this session holds on the old store and
        announce ``parked`` (module docstring)."""
        with self._moved:
            self._held.park(self.active)
        self.events.state_changed(SessionState.LOST)
        self._announce()
        log.info("bridged session: parked for the cut-over under way")

    def _unpark(self) -> None:
        """The cut-over ended without moving authority: take part on the old store again."""
        with self._moved:
            self._held.parked = False
        self._announce()
        self.events.state_changed(SessionState.CONNECTED)
        with self._moved:
            self._moved.notify_all()
        log.info("bridged session: the cut-over ended; the old store keeps authority")

    def _announced(self) -> bool:
        """Whether this session's announcement is in ``BRIDGED_GROUP`` (a lost session's is gone)."""
        return self._announced_as is not None and self._announced_as in self.active.membership(BRIDGED_GROUP)

    def _drop_new(self) -> None:
        """Close the new store's session while no cut-over is under way and authority is old."""
        if self._authority != NEW:
            self._close_side(NEW)

    def _close_side(self, which: str) -> None:
        side, self._sides[which] = self._sides[which], None
        if side is not None and side in self._opened:  # one never opened holds nothing
            self._opened.remove(side)
            side.close()

    def _on_side_state(self, which: str, state: SessionState) -> None:
        if which == self._authority:
            if not (self._held.parked and state is SessionState.CONNECTED):  # parked: LOST it stays
                self.events.state_changed(state)
            if state is SessionState.CONNECTED:
                self._kick.set()  # announce again (a new session) and re-check the markers

    def _on_side_changed(self, which: str, target: Target) -> None:
        if target == _MARKER_TARGET:
            self._kick.set()
        if which == self._authority and (target in self._watched or target != _MARKER_TARGET):
            self.events.changed(target)

    def _call(self, call: Callable[[FloorBackend], T]) -> T:
        """``call`` on the store with authority; once more on the next if authority moved meanwhile."""
        backend = self.active
        try:
            return call(backend)
        except ConsensusError:
            if backend is self._sides[self._authority]:
                raise
        return call(self.active)

    def _write(self, call: Callable[[FloorBackend], T], fence: Leadership | None) -> T:
        """A write: a ``SealedError`` waits for authority to move (module docstring)."""
        deadline = time.monotonic() + self.settings.request_timeout
        while True:
            backend = self.active
            parked = self._held.parked
            if parked and fence is not None:
                raise FencedError(
                    f"the leadership of {fence.service!r} was given up for a migration's cut-over; "
                    "lead again once it ends"
                )
            try:
                if not parked:
                    return call(backend)
            except SealedError as exc:
                if fence is not None:
                    raise FencedError(
                        f"the leadership of {fence.service!r} belongs to a sealed store: a migration "
                        "moved authority; lead again on the new store"
                    ) from exc
            except SessionLostError:
                if backend is self._sides[self._authority] or fence is not None:
                    raise
            self._kick.set()
            with self._moved:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise OperationTimeoutError(
                        "the store is sealed for a migration's cut-over and authority has not moved yet",
                        not_applied=True,
                    )
                self._moved.wait_for(partial(self._moved_from, backend, parked), min(left, RETRY))

    def _moved_from(self, backend: FloorBackend, parked: bool) -> bool:
        return self._sides[self._authority] is not backend or (parked and not self._held.parked)

    # Backend.

    @property
    def name(self) -> str:
        return self.active.name

    def open(self) -> None:
        old = self._side(OLD)
        to, cutting_over = self._read_markers()
        if to == NEW:
            self._side(NEW)
            self._authority = NEW
        self._held.parked = cutting_over and to == OLD
        self._announce()
        self._thread.start()
        bridge_metrics.bridged(self._authority, 1)
        log.debug("bridged session opened on the %s store (%s)", self._authority, old.url.redacted())

    def close(self) -> None:
        if not self._closed and self._thread.is_alive():
            bridge_metrics.bridged(self._authority, -1)
        self._closed = True
        self._kick.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(self.settings.request_timeout + REQUEUE_PAUSE)  # a move under way ends
        for which in (NEW, OLD):
            self._close_side(which)

    def fetch(self, key: str) -> Versioned | None:
        return self._call(lambda b: b.fetch(key))

    def put(self, key: str, value: bytes, fence: Leadership | None) -> int:
        return self._write(lambda b: b.put(key, value, fence), fence)

    def update(self, key: str, value: bytes, version: int | None, fence: Leadership | None) -> int:
        return self._write(lambda b: b.update(key, value, version, fence), fence)

    def delete(self, key: str, version: int | None, fence: Leadership | None) -> None:
        self._write(lambda b: b.delete(key, version, fence), fence)

    def keys(self, namespace: str) -> frozenset[str]:
        return self._call(lambda b: b.keys(namespace))

    def walk(self, namespace: str) -> Iterator[tuple[str, Versioned]]:
        return self.active.walk(namespace)

    def join(self, group: str, member_id: str, data: bytes) -> None:
        self._held.store(self.active).join(group, member_id, data)

    def leave(self, group: str, member_id: str) -> None:
        self._held.store(self.active).leave(group, member_id)

    def membership(self, group: str) -> dict[str, bytes]:
        return self._call(lambda b: b.membership(group))

    def nominate(self, service: str, candidate_id: str) -> bool:
        return self._held.nominate(self.active, service, candidate_id)

    def resign(self, service: str, candidate_id: str) -> None:
        self._held.resign(self.active, service, candidate_id)

    def leadership(self, service: str) -> Leadership | None:
        return self._call(lambda b: self._held.store(b).leadership(service))

    def watch(self, target: Target) -> None:
        self._watched.add(target)
        if target != _MARKER_TARGET:
            self.active.watch(target)

    def unwatch(self, target: Target) -> None:
        self._watched.discard(target)
        if target != _MARKER_TARGET:
            self.active.unwatch(target)

    def server_version(self) -> str | None:
        return self.active.server_version()

    def term_ceiling(self) -> int:
        return self.active.term_ceiling()

    def seal(self) -> None:
        self.active.seal()

    def unseal(self) -> None:
        self.active.unseal()

    def sealed(self) -> bool:
        return self.active.sealed()

    def session_identity(self) -> str:
        return self.active.session_identity()

    def live_sessions(self) -> frozenset[str] | None:
        return self.active.live_sessions()

    def fault_identity(self) -> Any:
        return self.active.fault_identity()


@dataclass(frozen=True, slots=True)
class _Side:
    """One store's reports (``BackendEvents``), routed by the bridge: only the store with authority
    reaches the core."""

    state_changed: Callable[[SessionState], None]
    changed: Callable[[Target], None]
