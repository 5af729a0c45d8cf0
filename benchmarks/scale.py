"""Scale: many members in one group, many groups, many watched keys; convergence time and memory.

Each workload runs in a child process of its own (``benchmarks.child scale``)
so that its resident memory (``/proc/<pid>/statm``) counts only the sessions
it hosts: measured once the backend and its client library are imported
(base), after the sessions are open and caught up with the backend's log by
one read (idle: ``rss_per_session_mb`` is the growth per session) and once
everything converged (loaded; for ``watched`` ``rss_per_key_kb``, the growth
per watched key; for the others
``rss_per_member_kb``, the growth per member, observer's view included).
Workloads:

* ``members``: SIZE members joined into one group by SESSIONS sessions (in
  parallel, one thread per session); converged when an observer session's
  group listener reports all of them.
* ``groups``: SIZE groups of ``PER_GROUP`` members, joined by SESSIONS
  sessions; converged when the observer's listeners on every group report
  all members.
* ``watched``: SIZE keys (written first, untimed) get a value listener each on
  one observer session: converged when every first event arrived; then a
  writer updates every key and ``update_ms`` runs until the observer has seen
  every new value.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from benchmarks.core import Plan, Row, Stamp, rss_mb, within
from benchmarks.procs import Child, ChildError
from consensus_api import (
    MembershipChanged,
    OperationTimeoutError,
    Session,
    ValueChanged,
    config,
    connect,
    registry,
)

PER_GROUP = 10
#: Target: everything converges within this many milliseconds per member or watched key (50 s
#: for 5,000 members), whatever the size, so that ``--quick`` keeps the full run's rate.
TARGET_MS_PER_ITEM = 10.0


def _parallel(items: Sequence[Any], work: Callable[[Any], Any], threads: int = 8) -> list[Any]:
    with ThreadPoolExecutor(max_workers=max(1, min(threads, len(items)))) as pool:
        return list(pool.map(work, items))


class _Counter:
    """Counts targets that reached their wanted state; stamps when all ``wanted`` have."""

    def __init__(self, wanted: int) -> None:
        self.wanted = wanted
        self.done: set[str] = set()
        self.lock = threading.Lock()
        self.stamp = Stamp()

    def mark(self, name: str, reached: bool) -> None:
        with self.lock:
            if reached:
                self.done.add(name)
            else:
                self.done.discard(name)
            complete = len(self.done) >= self.wanted
        if complete:
            self.stamp.set()


def _members(
    size: int, sessions: list[Session], observer: Session, *, groups: int, run: str, deadline: float
) -> dict[str, Any]:
    per_group = size // groups
    counter = _Counter(groups)
    names = [f"bench-scale-{run}-g{index}" for index in range(groups)]
    for name in names:

        def on_change(event: MembershipChanged, name: str = name) -> None:
            counter.mark(name, len(event.members) >= per_group)

        observer.group(name).add_listener(on_change)
    members = [(names[i // per_group], f"m{i}") for i in range(per_group * groups)]
    shares = [members[index :: len(sessions)] for index in range(len(sessions))]
    start = time.monotonic()

    def join(item: tuple[Session, list[tuple[str, str]]]) -> None:
        session, share = item
        for group, member in share:
            session.group(group).join(member)

    _parallel(list(zip(sessions, shares, strict=True)), join, threads=len(sessions))
    joined = time.monotonic()
    converged = counter.stamp.wait(max(0.0, deadline - time.monotonic()))
    if converged is None:
        raise TimeoutError(f"{len(counter.done)} of {groups} groups complete in time")
    return {"converge_ms": (converged - start) * 1000, "joined_ms": (joined - start) * 1000}


def _watched(size: int, writer: Session, observer: Session, run: str, deadline: float) -> dict[str, Any]:
    keys = [f"bench-scale-{run}/w/k{index}" for index in range(size)]
    setup = time.monotonic()
    _parallel(keys, lambda key: writer.storage.put(key, b"first"))
    first, updated = _Counter(size), _Counter(size)

    def on_change(event: ValueChanged) -> None:
        first.mark(event.key, True)
        updated.mark(event.key, event.value == b"second")

    start = time.monotonic()
    for key in keys:
        observer.listeners.add_value_listener(key, on_change)
    registered = first.stamp.wait(max(0.0, deadline - time.monotonic()))
    if registered is None:
        raise TimeoutError(f"{len(first.done)} of {size} first events in time")
    update_start = time.monotonic()
    _parallel(keys, lambda key: writer.storage.update(key, b"second"))
    seen = updated.stamp.wait(max(0.0, deadline - time.monotonic()))
    if seen is None:
        raise TimeoutError(f"{len(updated.done)} of {size} updates seen in time")
    return {
        "converge_ms": (registered - start) * 1000,
        "update_ms": (seen - update_start) * 1000,
        "setup_ms": (start - setup) * 1000,
    }


def _catch_up(session: Session, key: str, deadline: float) -> None:
    """Read ``key`` until a read completes within ``request_timeout``, until ``deadline``: on Kafka
    a read first waits for the session's replay of the whole command log, and the scale child's
    sessions replay it side by side on two cores, which after a full run's earlier workloads (tens
    of thousands of records) can take longer than one read may."""
    while True:
        try:
            session.storage.fetch(key)
            return
        except OperationTimeoutError:
            if time.monotonic() >= deadline:
                raise


def host(url: str, workload: str, size: int, sessions: int, deadline: float) -> str:
    """Run one workload in this (child) process; a JSON line with times (ms) and RSS (MiB)."""
    run = f"{int(time.time() * 1000) % 10**8}"
    registry.load_backend(config.parse_url(url)[0].scheme)  # imports count as base, not as sessions
    base = rss_mb()
    opened: list[Session] = _parallel(range(sessions + 1), lambda _: connect(url))
    # A read catches each session up with the backend's log, so the clock times the workload, not
    # the start-up replay of what earlier workloads wrote (Kafka: every record since the topic began).
    _parallel(opened, lambda session: _catch_up(session, f"bench-scale-{run}/caught-up", deadline))
    observer, others = opened[0], opened[1:]
    idle = rss_mb()
    try:
        if workload == "watched":
            result = _watched(size, others[0], observer, run, deadline - 5)
        else:
            groups = 1 if workload == "members" else size // PER_GROUP
            result = _members(size, others, observer, groups=groups, run=run, deadline=deadline - 5)
        loaded = rss_mb()
    finally:
        _parallel(opened, lambda session: session.close())
    return json.dumps(
        {
            **result,
            "sessions": len(opened),
            "rss_base_mb": round(base, 1),
            "rss_idle_mb": round(idle, 1),
            "rss_loaded_mb": round(loaded, 1),
            "rss_per_session_mb": round((idle - base) / len(opened), 2),
            "rss_loaded_per_session_mb": round((loaded - base) / len(opened), 2),
            ("rss_per_key_kb" if workload == "watched" else "rss_per_member_kb"): round(
                (loaded - idle) * 1024 / size, 2
            ),
        },
        separators=(",", ":"),
    )


def run(url: str, plan: Plan) -> list[Row]:
    """Rows ``scale.members_<n>``, ``scale.groups_<g>x<n>`` and ``scale.watched_<n>``."""
    specs = [
        (f"scale.members_{plan.members}", "members", plan.members, plan.sessions),
        (
            f"scale.groups_{plan.groups}x{plan.per_group}",
            "groups",
            plan.groups * plan.per_group,
            plan.sessions,
        ),
        (f"scale.watched_{plan.watched_keys}", "watched", plan.watched_keys, 1),
    ]
    rows = []
    for name, workload, size, sessions in specs:
        limit = TARGET_MS_PER_ITEM * size
        target = f"converge <= {TARGET_MS_PER_ITEM:g} ms per item ({limit / 1000:g} s)"
        child = Child("scale", url, workload, str(size), str(sessions), lifetime=plan.scale_timeout)
        try:
            found = json.loads(child.expect("RESULT", plan.scale_timeout + 30)[0])
        except ChildError as exc:
            rows.append(Row(name, None, None, target=target, holds=False, note=f"failed: {exc}"))
            continue
        finally:
            child.close()
        converge = round(found.pop("converge_ms"), 1)
        note = "ours_p50_ms: one run's time to converge; " + (plan.scale_note() or "full size")
        extra = {k: _rounded(v) for k, v in found.items()}
        holds = within(converge, limit)
        rows.append(Row(name, converge, None, target=target, holds=holds, note=note, extra=extra))
    return rows


def _rounded(value: Any) -> Any:
    return round(value, 1) if isinstance(value, float) else value
