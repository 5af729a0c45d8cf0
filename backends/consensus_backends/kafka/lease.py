"""The session's liveness: a driver thread drives its members, probes the cluster, decides its state.

A Kafka session is its members: members and candidates are Kafka group members
(``groups``), each kept alive by its heartbeats, and the session lives while
they do and the cluster answers.

Whenever a timed step below is due (every ``TICK`` seconds while a member has work under way;
at once when woken, as by a finished request that asks for action, ``Driver._pause``) the driver

* calls :meth:`Member.drive` (the mandatory kafka-python driver loop:
  (re)join when due, poll the heartbeat) on the members with work under way
  or that asked for it (:meth:`Driver.wake`), and on every member once every
  ``SWEEP`` seconds at most, so that idle members in many groups cost nothing
  per tick;
* probes the cluster with a ListOffsets request to the command log's leader
  every ``probe_interval`` and, on a cluster, asks another broker in turn
  which leader (by leader epoch) the log has: a partitioned leader goes on
  answering ListOffsets, so a newer leader elsewhere fails the probe once
  (SUSPENDED) and the probe moves to it (``Channel.leader_deposed``);
* has the watched groups described (``changes.Changes.step``);
* lists which groups of its own members are preparing a rebalance (one
  ListGroups per coordinator every ``LIST_INTERVAL``, whose cost does not
  grow with the groups; every ``IDLE_LIST_INTERVAL`` once nothing happened in
  them for ``ACTIVE_WINDOW``) and makes those members rejoin at once, rather than
  at their next heartbeat;
* derives the session state. SUSPENDED: the last probe failed or is overdue.
  LOST: a member was dropped by the broker, a joined member's last heartbeat
  is older than ``session_timeout`` (checked as the member is driven), or no probe succeeded for
  ``session_timeout`` (the broker may have dropped everything). On LOST the
  host tears down every member; CONNECTED follows once a probe succeeds and
  the host confirms the old members are recorded as departed and gone from
  their groups (:mod:`consensus_backends.kafka.departures`).

Nothing here blocks on the network: requests run as futures on the channel's
IO thread; blocking work goes to the :class:`Worker`.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from consensus_api.backend import BackendEvents
from consensus_api.model import SessionState
from consensus_backends.kafka.changes import Changes
from consensus_backends.kafka.client import Channel
from consensus_backends.kafka.member import Member
from consensus_backends.kafka.settings import Settings

log = logging.getLogger("consensus_api.kafka")

TICK = 0.05
#: How often the groups of the session's own members are checked for a rebalance (ListGroups).
LIST_INTERVAL = 0.05
#: ... and how often at rest: no rebalance seen, no change of a watched group reported and no member
#: of the session at work for ``ACTIVE_WINDOW`` seconds (a join into a group at rest waits this much
#: longer at most; the watched groups are described less often too, ``changes.IDLE_WATCH_INTERVAL``).
IDLE_LIST_INTERVAL = 0.25
ACTIVE_WINDOW = 10.0
#: The shortest sleep of the driver between two ticks, so that it never spins.
MIN_PAUSE = 0.001
#: Every member is driven at least this often (kafka-python wants a poll well within
#: ``max_poll_interval``, at least 30 s here); a tenth of the session timeout if that is shorter.
SWEEP = 1.0


class Host(Protocol):
    """What the driver needs from its backend."""

    def members(self) -> list[Member]:
        """Every live member and candidate of the session."""

    def teardown(self) -> None:
        """The session is LOST: stop every member now; may finish later, on the worker."""

    def recovered(self) -> bool:
        """True once every member the session gave up is recorded as departed and gone from its
        group; starts that work (on the worker) if it is pending."""


class Worker:
    """One thread running submitted tasks in order; a task that raises is logged."""

    def __init__(self) -> None:
        self._tasks: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="consensus-kafka-worker", daemon=True)
        self._thread.start()

    def submit(self, task: Callable[[], None]) -> None:
        """Run ``task`` on the worker thread."""
        self._tasks.put(task)

    def stop(self, timeout: float) -> None:
        """Finish the queued tasks (waiting at most ``timeout``) and end the thread."""
        self._tasks.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        while (task := self._tasks.get()) is not None:
            try:
                task()
            except Exception:
                log.exception("a Kafka backend task failed")


class Driver:
    """The driver thread of one session."""

    def __init__(
        self, settings: Settings, channel: Channel, events: BackendEvents, host: Host, changes: Changes
    ) -> None:
        self._settings = settings
        self._channel = channel
        self._events = events
        self._host = host
        self._changes = changes
        self._wakeup = threading.Condition()
        self._stopping = False
        self._state = SessionState.CONNECTED
        self._probe_interval = min(0.5, settings.session_timeout / 6)
        self._probe_timeout = max(0.5, min(settings.request_timeout, settings.session_timeout / 3))
        self._probe: Any = None
        self._check: Any = None  # a Channel.leader_deposed in flight
        self._probe_started = 0.0
        self._probe_ended = 0.0  # when the last probe's answer came (set on the channel's IO thread)
        self._last_ok = time.monotonic()
        self._failing = False
        self._listing: Any = None  # a Channel.rebalancing_async in flight
        self._listing_sent = 0.0
        self._sweep = min(SWEEP, settings.session_timeout / 10)
        self._swept_at = 0.0
        self._busy: set[Member] = set()  # driven every tick: work under way, or woken
        self._woken: set[Member] = set()
        self._kicked = False
        self._active_at = time.monotonic()  # a rebalance seen or a member at work (``ACTIVE_WINDOW``)
        self._thread = threading.Thread(target=self._run, name="consensus-kafka-driver", daemon=True)

    def start(self) -> None:
        """Start the driver thread."""
        self._thread.start()

    def stop(self, timeout: float) -> None:
        """End the driver thread."""
        with self._wakeup:
            self._stopping = True
            self._wakeup.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)

    def wake(self, member: Member | None = None) -> None:
        """Tick now, driving ``member`` if given (any thread, never blocks)."""
        with self._wakeup:
            if member is not None:
                self._woken.add(member)
            self._kicked = True
            self._wakeup.notify()

    def _run(self) -> None:
        pause = TICK
        while True:
            with self._wakeup:
                if self._stopping:
                    return
                if not self._kicked:  # a wake during the last tick (e.g. from it) is not lost
                    self._wakeup.wait(pause)
                self._kicked = False
                if self._stopping:
                    return
            try:
                pause = self._tick(time.monotonic())
            except Exception:
                log.exception("the Kafka backend's driver tick failed")
                pause = TICK

    def _tick(self, now: float) -> float:
        """Drive, probe, watch and judge the state; seconds until the next timed step is due."""
        members = self._host.members()
        with self._wakeup:
            woken, self._woken = self._woken, set()
        if now - self._swept_at >= self._sweep:
            self._swept_at = now
            driven = members
        else:
            driven = list(self._busy | woken)
        self._busy = {member for member in driven if member.drive()}
        if self._busy or woken:
            self._active_at = now
        self._probe_step(now)
        self._watch_step(now, members)
        self._state_step(now, driven)
        return self._pause(now, members)

    def _pause(self, now: float, members: list[Member]) -> float:
        """Seconds from ``now`` until a timed step is due: ``TICK`` while a member is at work, else
        the next sweep, probe (or its timeout), listing or description. A finished request that
        asks for action wakes the driver sooner (``_start``): a description, a failed probe or any
        probe while the session is not CONNECTED, a listing that found a rebalance, a check that
        found a new leader. One that does not is read at the next step due (the probe's answer
        keeps the time it came, ``_probe_ended``), so a session at rest wakes once per step."""
        if self._busy:
            return TICK
        probe_due = self._probe_started + self._probe_interval
        if self._probe is not None and now >= probe_due:
            probe_due = self._probe_started + self._probe_timeout
        due = [self._swept_at + self._sweep, self._changes.due(), probe_due]
        if members:
            due.append(self._listing_sent + self._list_interval(now))
        return max(MIN_PAUSE, min((at for at in due if at > now), default=now + TICK) - now)

    def _list_interval(self, now: float) -> float:
        return LIST_INTERVAL if now - self._active_at < ACTIVE_WINDOW else IDLE_LIST_INTERVAL

    def _start(
        self, function: Callable[..., Any], *args: Any, wake_if: Callable[[Any], bool] | None = None
    ) -> Any:
        """``function`` started on the channel's IO thread; the driver ticks as soon as it is done, or,
        with ``wake_if``, only if ``wake_if(value or exception)`` (on the IO thread) says so."""
        future = self._channel.start(function, *args)
        future.add_both(lambda outcome: self.wake() if wake_if is None or wake_if(outcome) else None)
        return future

    def _probe_answered(self, outcome: Any) -> bool:
        """A probe's end: wake the driver if it failed or the session is not CONNECTED."""
        self._probe_ended = time.monotonic()
        failed = isinstance(outcome, BaseException)
        return failed or self._failing or self._state is not SessionState.CONNECTED

    def _probe_step(self, now: float) -> None:
        probe = self._probe
        if probe is not None and probe.is_done:
            self._probe = None
            if probe.exception is None:
                self._last_ok, self._failing = max(self._probe_ended, self._probe_started), False
            else:
                self._failing = True
        elif probe is not None and now - self._probe_started > self._probe_timeout:
            self._failing = True
        check = self._check
        if check is not None and check.is_done:
            self._check = None
            if check.exception is None and check.value:
                log.warning("the Kafka command log's leader was cut off from the cluster; moving on")
                self._failing = True  # SUSPENDED until the newer leader answers a probe
        if self._probe is None and now - self._probe_started >= self._probe_interval:
            self._probe_started = now
            self._probe = self._start(self._channel.probe, wake_if=self._probe_answered)
            if self._check is None:
                self._check = self._start(self._channel.leader_deposed, wake_if=_found_newer_leader)

    def _watch_step(self, now: float, members: list[Member]) -> None:
        if self._changes.step(now, self._start, at_rest=now - self._active_at >= ACTIVE_WINDOW):
            self._active_at = now
        listing = self._listing
        if listing is not None and listing.is_done:
            self._listing = None
            if listing.exception is None:
                for member in members:
                    if member.group_id in listing.value:
                        self._active_at = now
                        member.rebalance_seen(self._listing_sent)
        groups = {member.group_id for member in members}
        if self._listing is None and groups and now - self._listing_sent >= self._list_interval(now):
            self._listing_sent = now
            self._listing = self._start(self._channel.rebalancing_async, sorted(groups), wake_if=bool)

    def _state_step(self, now: float, members: list[Member]) -> None:
        session = self._settings.session_timeout
        if self._state is SessionState.LOST:
            if not self._failing and now - self._last_ok < session and self._host.recovered():
                self._report(SessionState.CONNECTED)
            return
        dropped = [m for m in members if m.lost or m.overdue(session)]
        if dropped or now - self._last_ok > session:
            reason = f"member {dropped[0].own_id!r} of {dropped[0].group_id!r}" if dropped else "no contact"
            log.warning("Kafka session lost (%s); dropping every member and candidacy", reason)
            self._report(SessionState.LOST)
            self._host.teardown()
        elif self._failing:
            self._report(SessionState.SUSPENDED)
        elif self._state is SessionState.SUSPENDED:
            self._report(SessionState.CONNECTED)
        else:
            self._host.recovered()  # departures that failed while CONNECTED are retried

    def _report(self, state: SessionState) -> None:
        if state is not self._state:
            self._state = state
            self._events.state_changed(state)


def _found_newer_leader(outcome: Any) -> bool:
    """Whether a leader check's end asks the driver to act: it found a newer leader (its errors are
    ignored)."""
    return outcome is True
