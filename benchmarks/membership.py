"""Membership propagation: a join in one process, then an observer's callback in another.

A child process (``benchmarks.child joiner``) joins a group; this process
observes it. Latency runs from ``time.monotonic()`` just before the child's
join call to the observer's callback that shows the new member (the same
system-wide clock in both processes). Ours: a group listener on the benchmark
session. tooz: ``watch_join_group`` with ``run_watchers`` called every 10 ms,
where tooz has membership (ZooKeeper, etcd). Joins of the two alternate,
after ``WARM_UP`` untimed joins of each (a fresh child's first join is
start-up); after each join the member leaves and the observer sees it go
before the next.
Target: p99 <= 5 ms on ZooKeeper, etcd and PostgreSQL; where changes are polled
(SQLite) the same absolute bound as a value's propagation.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from benchmarks import tooz_baseline
from benchmarks.core import EVENT_TIMEOUT, WARM_UP, Plan, Row, Stamp, ms, ratio, within
from benchmarks.procs import Child
from benchmarks.propagation import ABSOLUTE_P99_MS
from consensus_api import MembershipChanged, Session

TARGET_P99_MS = {"zookeeper": 5.0, "etcd": 5.0, "postgresql": 5.0, "sqlite": ABSOLUTE_P99_MS["sqlite"]}


class Observed:
    """Stamps for ``(join|leave, member)`` events, set by whichever observer sees them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[tuple[str, str], Stamp] = {}
        self._members: frozenset[str] = frozenset()

    def expect(self, what: str, member: str) -> Stamp:
        stamp = Stamp()
        with self._lock:
            self._pending[(what, member)] = stamp
            gone = member not in self._members
        if what == "leave" and gone:
            stamp.set()
        return stamp

    def event(self, what: str, member: str) -> None:
        """tooz's callbacks: one member joined or left."""
        with self._lock:
            members = self._members | {member} if what == "join" else self._members - {member}
        self.members(members)

    def members(self, members: frozenset[str]) -> None:
        """Our callbacks: the whole membership."""
        now = time.monotonic()
        with self._lock:
            joined, left = members - self._members, self._members - members
            self._members = members
            hits = [self._pending.pop(("join", m), None) for m in joined]
            hits += [self._pending.pop(("leave", m), None) for m in left]
        for stamp in hits:
            if stamp is not None:
                stamp.set(now)


def _join_once(child: Child, observed: Observed, member: str) -> float:
    """One join → callback latency, then the leave (awaited, not timed)."""
    joined = observed.expect("join", member)
    child.send(f"JOIN {member}")
    start = float(child.expect("JOINED")[0])
    seen = joined.wait(EVENT_TIMEOUT * 3)
    if seen is None:
        raise TimeoutError(f"the observer never saw {member} join")
    left = observed.expect("leave", member)
    child.send(f"LEAVE {member}")
    child.expect("LEFT")
    if left.wait(EVENT_TIMEOUT * 3) is None:
        raise TimeoutError(f"the observer never saw {member} leave")
    return seen - start


def run(session: Session, url: str, plan: Plan, run_id: str) -> list[Row]:
    """One row: ``membership.join``."""
    group = f"bench-{run_id}-members"
    ours_seen = Observed()

    def on_change(event: MembershipChanged) -> None:
        ours_seen.members(frozenset(event.members))

    session.group(group).add_listener(on_change)
    ours_child = Child("joiner", "ours", url, group)
    toozurl = tooz_baseline.tooz_url(url, "membership")
    tooz_child: Child | None = None
    observer: Any = None
    pump: tooz_baseline.Pump | None = None
    tooz_seen = Observed()
    ours_times: list[float] = []
    tooz_times: list[float] = []
    try:
        ours_child.expect("READY")
        if toozurl is not None:
            observer = tooz_baseline.coordinator(toozurl, f"observer-{run_id}")
            tooz_baseline.create_group(observer, group)
            observer.watch_join_group(group.encode(), lambda e: tooz_seen.event("join", e.member_id.decode()))
            observer.watch_leave_group(
                group.encode(), lambda e: tooz_seen.event("leave", e.member_id.decode())
            )
            pump = tooz_baseline.Pump(observer)
            tooz_child = Child("joiner", "tooz", toozurl, group, "joiner")
            tooz_child.expect("READY")
        for index in range(WARM_UP):
            _join_once(ours_child, ours_seen, f"warm{index}")
            if tooz_child is not None:
                _join_once(tooz_child, tooz_seen, "joiner")
        for index in range(plan.membership_samples):
            ours_times.append(_join_once(ours_child, ours_seen, f"m{index}"))
            if tooz_child is not None:
                tooz_times.append(_join_once(tooz_child, tooz_seen, "joiner"))
    finally:
        session.group(group).remove_listener(on_change)
        for child in (ours_child, tooz_child):
            if child is not None:
                child.close()
        if pump is not None:
            pump.stop()
        if observer is not None:
            tooz_baseline.stop(observer)
    ours_p99 = ms(ours_times, 99)
    limit = TARGET_P99_MS.get(session.backend)
    baseline = "tooz (run_watchers every 10 ms)" if toozurl is not None else None
    tooz_p99 = ms(tooz_times, 99)
    return [
        Row(
            "membership.join",
            ms(ours_times, 50),
            ours_p99,
            baseline,
            ms(tooz_times, 50),
            tooz_p99,
            ratio(ours_p99, tooz_p99),
            f"p99 <= {limit:g} ms" if limit is not None else None,
            within(ours_p99, limit),
            note=None if toozurl is not None else tooz_baseline.missing(url, "membership"),
            extra={"samples": len(ours_times)},
        )
    ]
