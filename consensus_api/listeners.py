"""Listener bookkeeping and ordered, converging delivery (<https://consensus-api.github.io/consensus-api/spec/#5-listenerregistry-kip-30-listenerregistry>).

A backend only says that a target may have changed; the hub re-reads the
target on the dispatcher thread and gives every callback the state it has
not seen yet. Because one thread reads each target in turn, events for a
target are in order; because every hint is followed by a fresh read, the last
event equals the stored state (convergence). Hints that arrive while a read
is pending are coalesced into that read. While the session is not connected,
reads wait for the resync that follows the reconnect instead of blocking the
dispatcher thread on a backend that cannot answer. The first read after a
listener is added and the reads of a resync are linearizable (``strict``);
the re-read after a hint may use the backend's ``change_reader``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from consensus_api.backend import Target, TargetKind
from consensus_api.dispatch import Dispatcher
from consensus_api.errors import ConsensusError
from consensus_api.keys import check_key, check_namespace
from consensus_api.model import Event, KeySetChanged, LeaderChanged, ValueChanged

log = logging.getLogger("consensus_api")

RETRY_DELAY = 0.5

Callback = Callable[[Any], None]


@dataclass(eq=False)
class _Listener:
    callback: Callback
    last: Event | None = None


@dataclass(eq=False)
class _Subscription:
    listeners: list[_Listener] = field(default_factory=list)
    high_water: int = -1


class ListenerHub:
    """Callbacks per target, fed by re-reads on the dispatcher thread."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        read: Callable[[Target, bool], Event],
        watch: Callable[[Target], None],
        unwatch: Callable[[Target], None],
        connected: Callable[[], bool],
        *,
        on_read: Callable[[Event, float | None], None] | None = None,
    ) -> None:
        """``on_read(event, lag)`` (telemetry) sees every fresh read with the seconds since the first
        change notification it answers (None for a read no notification asked for)."""
        self._on_read = on_read
        self._dispatcher = dispatcher
        self._connected = connected
        self._read = read
        self._watch = watch
        self._unwatch = unwatch
        self._lock = threading.RLock()
        self._subscriptions: dict[Target, _Subscription] = {}
        self._pending: set[Target] = set()
        self._strict: set[Target] = set()
        self._notified_at: dict[Target, float] = {}

    def add(self, target: Target, callback: Callback) -> None:
        """Register ``callback``; its first event reports the current state."""
        if not callable(callback):
            raise TypeError(f"callback must be callable, not {type(callback).__name__}")
        with self._lock:
            subscription = self._subscriptions.get(target)
            if subscription is None:
                self._watch(target)
                subscription = self._subscriptions[target] = _Subscription()
            if any(entry.callback == callback for entry in subscription.listeners):
                return
            subscription.listeners.append(_Listener(callback))
        self._request(target, strict=True)

    def remove(self, target: Target, callback: Callback) -> None:
        """Unregister ``callback``; unknown callbacks are ignored."""
        with self._lock:
            subscription = self._subscriptions.get(target)
            if subscription is None:
                return
            subscription.listeners = [e for e in subscription.listeners if e.callback != callback]
            if not subscription.listeners:
                del self._subscriptions[target]
                self._notified_at.pop(target, None)
                self._unwatch(target)

    def targets(self) -> list[Target]:
        """Every watched target."""
        with self._lock:
            return list(self._subscriptions)

    def changed(self, target: Target) -> None:
        """Schedule a re-read of ``target``; coalesces with a pending one. Any thread."""
        if self._on_read is not None:
            with self._lock:
                if target in self._subscriptions:
                    self._notified_at.setdefault(target, time.monotonic())
        self._request(target, strict=False)

    def resync(self) -> None:
        """Re-read every watched target linearizably (after a reconnect or session loss)."""
        for target in self.targets():
            self._request(target, strict=True)

    def _request(self, target: Target, *, strict: bool) -> None:
        with self._lock:
            if target not in self._subscriptions:
                return
            if strict:
                self._strict.add(target)
            if target in self._pending:
                return
            self._pending.add(target)
        self._dispatcher.submit(lambda: self._refresh(target))

    def announce_leader_lost(self, service: str, candidates: set[str]) -> None:
        """On the dispatcher thread: tell listeners who last saw one of ``candidates`` lead
        ``service`` that nobody is known to lead it now (the session was lost)."""
        with self._lock:
            subscription = self._subscriptions.get(Target(TargetKind.ELECTION, service))
            listeners = list(subscription.listeners) if subscription else []
        for listener in listeners:
            last = listener.last
            if isinstance(last, LeaderChanged) and last.leader_id in candidates:
                self._deliver(listener, LeaderChanged(service, None, None))

    def _refresh(self, target: Target) -> None:
        with self._lock:
            self._pending.discard(target)
            strict = target in self._strict
            self._strict.discard(target)
            notified_at = self._notified_at.pop(target, None)
            if target not in self._subscriptions:
                return
        if not self._connected():
            return  # the resync after the reconnect reads it
        try:
            event = self._read(target, strict)
        except ConsensusError as exc:
            log.debug("re-reading %s failed (%s); retrying", target, exc)
            self._dispatcher.submit_later(RETRY_DELAY, lambda: self._request(target, strict=strict))
            return
        with self._lock:
            subscription = self._subscriptions.get(target)
            if subscription is None:
                return
            mark = _order_mark(event)
            if mark is not None:
                if mark < subscription.high_water:
                    log.warning("dropped a stale read of %s (%s)", target, event)
                    return
                subscription.high_water = mark
            listeners = list(subscription.listeners)
        if self._on_read is not None:
            self._on_read(event, None if notified_at is None else time.monotonic() - notified_at)
        for listener in listeners:
            if listener.last != event:
                self._deliver(listener, event)

    @staticmethod
    def _deliver(listener: _Listener, event: Event) -> None:
        listener.last = event
        try:
            listener.callback(event)
        except Exception:
            log.exception("listener %r raised on %s; delivery continues", listener.callback, event)


def _order_mark(event: Event) -> int | None:
    if isinstance(event, ValueChanged):
        return event.version
    if isinstance(event, LeaderChanged):
        return event.term
    return None


class ListenerRegistry:
    """Value and key-set listeners of a session (KIP-30 ListenerRegistry)."""

    def __init__(self, hub: ListenerHub) -> None:
        self._hub = hub

    def add_value_listener(self, key: str, callback: Callable[[ValueChanged], None]) -> None:
        """Call ``callback`` with the value of ``key`` now and after every change."""
        self._hub.add(Target(TargetKind.VALUE, check_key(key)), callback)

    def remove_value_listener(self, key: str, callback: Callable[[ValueChanged], None]) -> None:
        """Stop calling ``callback`` for ``key``."""
        self._hub.remove(Target(TargetKind.VALUE, check_key(key)), callback)

    def add_keyset_listener(self, namespace: str, callback: Callable[[KeySetChanged], None]) -> None:
        """Call ``callback`` with the keys one level below ``namespace`` now and after every change."""
        self._hub.add(Target(TargetKind.KEYSET, check_namespace(namespace)), callback)

    def remove_keyset_listener(self, namespace: str, callback: Callable[[KeySetChanged], None]) -> None:
        """Stop calling ``callback`` for ``namespace``."""
        self._hub.remove(Target(TargetKind.KEYSET, check_namespace(namespace)), callback)
