"""The steward of an incremental group: KIP-848's group coordinator, run by the member that leads
the group's election, on its own thread.

It keeps the group state blob (:mod:`reconcile`) at ``<root>/state``: it
watches the membership (member data = the digest of its subscription), every member's
acknowledgement ``<root>/owned/<member>``, and re-runs :func:`reconcile` after
every change. Each write replaces the whole blob, compared with its version
and fenced by the steward's leadership, so member entries and ownership change
together and a deposed steward changes nothing. A member that does not
acknowledge a revocation within ``rebalance_timeout`` is fenced. Members that
left are dropped and their acknowledgements deleted.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from typing import TYPE_CHECKING

from consensus_api.assignors import Assignor
from consensus_api.coordinator.loop import Mirror, StepThread
from consensus_api.coordinator.reconcile import UNREVOKED, Ack, GroupState, digest, reconcile
from consensus_api.errors import (
    ConsensusError,
    FencedError,
    KeyExistsError,
    KeyNotFoundError,
    VersionConflictError,
)
from consensus_api.model import Leadership, MembershipChanged, ValueChanged

if TYPE_CHECKING:
    from consensus_api.coordinator.incremental import IncrementalLayout
    from consensus_api.session import Session

log = logging.getLogger("consensus_api.coordinator")

IDLE = 1.0


def publish_subscription(session: Session, layout: IncrementalLayout, resources: frozenset[str]) -> bytes:
    """Store ``resources`` under their digest (once per distinct set); the membership data naming it."""
    fingerprint = digest(resources)
    with contextlib.suppress(KeyExistsError):
        session.storage.put(layout.subscription(fingerprint), json.dumps(sorted(resources)).encode())
    return fingerprint.encode()


class Steward:
    """Runs while its member leads the group's election (``lead``); idle otherwise."""

    def __init__(
        self, session: Session, layout: IncrementalLayout, assignor: Assignor, timeout: float
    ) -> None:
        self._session = session
        self._layout = layout
        self._assignor = assignor
        self._timeout = timeout
        self._lock = threading.Lock()
        self._leadership: Leadership | None = None
        self._thread = StepThread(f"consensus-steward-{layout.group}", self._step, self._stop_mirrors)
        self._members: Mirror[MembershipChanged] | None = None
        self._state: Mirror[ValueChanged] | None = None
        self._acks: dict[str, Mirror[ValueChanged]] = {}
        self._known: tuple[GroupState | None, int | None] = (None, None)
        self._unrevoked: dict[str, tuple[int, float]] = {}
        self._subscriptions: dict[str, frozenset[str]] = {}

    def lead(self, leadership: Leadership | None) -> None:
        """This member leads (``leadership``) or does not (None). Any thread."""
        with self._lock:
            self._leadership = leadership
        if leadership is not None:
            self._thread.start()
        self._thread.wake()

    def stop(self) -> None:
        """Stop for good."""
        self._thread.stop(self._session.settings.request_timeout)

    def _step(self) -> float:
        with self._lock:
            leadership = self._leadership
        if leadership is None:
            self._stop_mirrors()
            return IDLE
        members_event, state_event = self._start_mirrors()
        if members_event is None or state_event is None:
            return IDLE
        state, version = self._latest(state_event)
        live = {
            m: resources
            for m, data in members_event.members.items()
            if (resources := self._subscription(data)) is not None
        }
        self._follow_acks(set(live) | set(state.members if state else ()))
        acks = {m: ack for m, mirror in self._acks.items() if (ack := _ack(mirror)) is not None}
        now = time.monotonic()
        expired = [m for m, (_, since) in self._unrevoked.items() if now - since > self._timeout]
        current = state if state is not None else GroupState()
        new = reconcile(current, live, acks, expired, self._assignor)
        timers: dict[str, tuple[int, float]] = {}
        for member, entry in new.members.items():
            if entry.state == UNREVOKED:
                timer = self._unrevoked.get(member)
                timers[member] = timer if timer is not None and timer[0] == entry.seq else (entry.seq, now)
        self._unrevoked = timers
        if state is None or new != state:
            self._write(leadership, new, version)
            self._forget_departed(current, new)
        deadlines = [since + self._timeout - now for _, since in self._unrevoked.values()]
        return max(0.01, min([IDLE, *deadlines]))

    def _subscription(self, data: bytes) -> frozenset[str] | None:
        """The subscription a member's data names (read once per digest); None if unreadable."""
        fingerprint = data.decode(errors="replace")
        if fingerprint not in self._subscriptions:
            stored = self._session.storage.fetch(self._layout.subscription(fingerprint))
            try:
                resources = frozenset(str(r) for r in json.loads(stored.value)) if stored else None
            except (ValueError, TypeError):
                resources = None
            if resources is None or digest(resources) != fingerprint:
                return None
            self._subscriptions[fingerprint] = resources
        return self._subscriptions[fingerprint]

    def _latest(self, mirror: Mirror[ValueChanged]) -> tuple[GroupState | None, int | None]:
        event = mirror.event
        known, known_version = self._known
        if event is not None and event.version is not None and (known_version or -1) < event.version:
            known, known_version = GroupState.decode(event.value), event.version
            self._known = (known, known_version)
        return known, known_version

    def _write(self, lead: Leadership, state: GroupState, version: int | None) -> None:
        storage, key = self._session.storage, self._layout.state
        try:
            if version is None:
                written = storage.put(key, state.encode(), fence=lead)
            else:
                written = storage.update(key, state.encode(), version=version, fence=lead)
        except (VersionConflictError, KeyExistsError, KeyNotFoundError):
            stored = storage.fetch(key)
            self._known = (GroupState.decode(stored.value), stored.version) if stored else (None, None)
            return
        except FencedError:
            with self._lock:
                if self._leadership == lead:
                    self._leadership = None
            return
        self._known = (state, written)

    def _forget_departed(self, old: GroupState, new: GroupState) -> None:
        for member in set(old.members) - set(new.members):
            try:
                self._session.storage.delete(self._layout.ack(member))
            except KeyNotFoundError:
                pass
            except ConsensusError as exc:
                log.debug("could not delete the acknowledgement of %s (%s)", member, exc)

    def _follow_acks(self, members: set[str]) -> None:
        for member in set(self._acks) - members:
            self._acks.pop(member).stop()
        listeners = self._session.listeners
        for member in members - set(self._acks):
            key = self._layout.ack(member)
            mirror: Mirror[ValueChanged] = Mirror(
                lambda cb, key=key: listeners.add_value_listener(key, cb),  # type: ignore[misc]
                lambda cb, key=key: listeners.remove_value_listener(key, cb),  # type: ignore[misc]
                self._thread.wake,
            )
            mirror.start()
            self._acks[member] = mirror

    def _start_mirrors(self) -> tuple[MembershipChanged | None, Mirror[ValueChanged] | None]:
        if self._members is None:
            group = self._session.group(self._layout.root)
            self._members = Mirror(group.add_listener, group.remove_listener, self._thread.wake)
            self._members.start()
        if self._state is None:
            key, listeners = self._layout.state, self._session.listeners
            self._state = Mirror(
                lambda cb: listeners.add_value_listener(key, cb),
                lambda cb: listeners.remove_value_listener(key, cb),
                self._thread.wake,
            )
            self._state.start()
        return self._members.event, self._state if self._state.event is not None else None

    def _stop_mirrors(self) -> None:
        for mirror in [self._members, self._state, *self._acks.values()]:
            if mirror is not None:
                mirror.stop()
        self._members = self._state = None
        self._acks = {}
        self._known = (None, None)
        self._unrevoked = {}


def _ack(mirror: Mirror[ValueChanged]) -> Ack | None:
    event = mirror.event
    return None if event is None else Ack.decode(event.value)
