"""How the Kafka backend learns that a watched target changed: the command log, and group descriptions.

* Values and key sets: the session's log reader names the targets each command
  it applies changed (``commandlog``); ``applied`` reports the watched ones. A
  command that records departures (``departures``) also names the Kafka groups
  it touched: every watched target read from one of them is reported too, since
  what a read of it answers may have changed.
* Groups and elections: the driver's tick (``lease.Driver``) has every watched
  group described (the membership group once for all its watched groups) every
  ``WATCH_INTERVAL`` while they hold at most ``MEMBERS_PER_WATCH`` members in
  all, proportionally less often above that (at most ``MAX_WATCH_INTERVAL``
  apart), so that big groups do not multiply the cost of watching; at rest (the
  driver saw nothing happen for a while) every ``IDLE_WATCH_INTERVAL`` at least. A target
  is reported when what a read of it would answer may have changed
  (``Observed.fingerprint``). A read may still see a state that falls between
  two descriptions (a member in the instant before its departure is applied);
  departures are reported as the log applies them, so such a read is always
  followed by another.

Before a change is reported, ``Observed.reporting`` hears of it (the re-read of
a group must describe it anew).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import Any, Protocol

from consensus_api.backend import BackendEvents, Target
from consensus_backends.kafka.client import Channel, GroupView

WATCH_INTERVAL = 0.1
MEMBERS_PER_WATCH = 100
#: The longest interval between two descriptions of the watched groups.
MAX_WATCH_INTERVAL = 1.0
#: The shortest interval between two descriptions while the session is at rest (``step``).
IDLE_WATCH_INTERVAL = 0.25

#: ``start(function, *args)``: ``function`` started on the channel's IO thread (a future).
Start = Callable[..., Any]


class Observed(Protocol):
    """What the group feed asks of the session's groups (``groups.Groups``)."""

    def fingerprint(self, target: Target, view: GroupView) -> object:
        """A value that changes whenever a read of ``target`` from ``view`` may answer differently."""

    def reporting(self, target: Target) -> None:
        """A change of ``target`` is about to be reported."""


class Changes:
    """The session's watched targets, and the two feeds that report their changes (see the module
    docstring). ``group_of(target)``: the Kafka group a target is read from, or None (values, key
    sets, or a backend not open)."""

    def __init__(self, events: BackendEvents, group_of: Callable[[Target], str | None]) -> None:
        self._events = events
        self._group_of = group_of
        self._lock = threading.Lock()
        self._watched: set[Target] = set()
        self._observed: Observed | None = None
        self._channel: Channel | None = None
        # The group feed, once the backend is open (``attach``).
        self._described: dict[Target, str] = {}  # target -> the Kafka group it is read from
        self._fingerprints: dict[Target, object] = {}
        self._describe: Any = None
        self._described_at = 0.0
        self._watch_interval = WATCH_INTERVAL
        self._at_rest = False

    def attach(self, channel: Channel, observed: Observed) -> None:
        """The backend is open: groups are described on ``channel``, and ``observed`` hears of every
        change reported."""
        self._channel, self._observed = channel, observed

    def watch(self, target: Target) -> None:
        """Report changes of ``target``; a group or election once the backend is open."""
        with self._lock:
            self._watched.add(target)
        group_id = self._group_of(target) if self._channel is not None else None
        if group_id is not None:
            with self._lock:
                self._described[target] = group_id

    def unwatch(self, target: Target) -> None:
        """Stop reporting changes of ``target``."""
        with self._lock:
            self._watched.discard(target)
            self._described.pop(target, None)
            self._fingerprints.pop(target, None)

    def applied(self, targets: list[Target], departed_in: frozenset[str]) -> None:
        """From the log reader: report the watched targets a command changed, and every watched target
        read from a Kafka group it recorded departures in."""
        with self._lock:
            touched = [target for target in targets if target in self._watched]
            if departed_in:
                touched += [t for t in self._watched if t not in targets and self._group_of(t) in departed_in]
        for target in touched:
            self._report(target)

    def step(self, now: float, start: Start, *, at_rest: bool) -> bool:
        """From the driver's tick: compare the last description of the watched groups, if it came,
        and have them described again when due (``start``: on the channel's IO thread; ``at_rest``:
        nothing happened lately, so at most every ``IDLE_WATCH_INTERVAL``). True if a change was
        reported."""
        with self._lock:
            watched = dict(self._described)
        self._at_rest = at_rest
        changed = False
        done = self._describe
        if done is not None and done.is_done:
            self._describe = None
            if done.exception is None:
                changed = self._compare(watched, done.value)
                described = sum(len(view.members) for view in done.value.values())
                self._watch_interval = min(
                    MAX_WATCH_INTERVAL, max(WATCH_INTERVAL, WATCH_INTERVAL * described / MEMBERS_PER_WATCH)
                )
        if self._describe is None and watched and now - self._described_at >= self._interval():
            assert self._channel is not None  # a target is described only once attached
            self._described_at = now
            self._describe = start(self._channel.describe_async, sorted(set(watched.values())))
        return changed

    def _interval(self) -> float:
        return max(self._watch_interval, IDLE_WATCH_INTERVAL) if self._at_rest else self._watch_interval

    def due(self) -> float:
        """When (monotonic) ``step`` next has the watched groups described; ``inf`` while none is
        watched or a description is under way (its end wakes the driver)."""
        with self._lock:
            watched = bool(self._described)
        if not watched or self._describe is not None:
            return math.inf
        return self._described_at + self._interval()

    def _compare(self, watched: dict[Target, str], views: dict[str, GroupView]) -> bool:
        """Report the watched targets whose fingerprint changed; True if any did."""
        reported = False
        observed = self._observed
        assert observed is not None  # a target is described only once attached
        for target, group_id in watched.items():
            view = views.get(group_id)
            if view is None:
                continue
            fingerprint = observed.fingerprint(target, view)
            with self._lock:
                changed = target in self._described and self._fingerprints.get(target) != fingerprint
                if changed:
                    self._fingerprints[target] = fingerprint
            if changed:
                reported = True
                self._report(target)
        return reported

    def _report(self, target: Target) -> None:
        if self._observed is not None:
            self._observed.reporting(target)
        self._events.changed(target)
