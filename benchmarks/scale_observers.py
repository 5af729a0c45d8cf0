"""Scale as observers feel it: many members join one group; when does every observer see each one,
and what does watching cost an observer?

Processes, all children of the harness on this host (``benchmarks.child``):

* ``OBSERVERS`` observer processes (``observe URL GROUP SIZE``), one session each with a listener
  on the group; each records, per member, the wall-clock time (``time.time()``, comparable across
  processes on one host) of the first event that lists it, and its own CPU time
  (``time.process_time()``) from the start signal until it has seen every member;
* one joiner process (``join URL GROUP SIZE SESSIONS``) whose ``SESSIONS`` sessions join the
  members in parallel, recording the wall-clock time each ``join`` returned.

Per member, latency = first seen by an observer - its join returned (a member seen before its join
returned counts 0); the row's p50/p99 are over every (member, observer) pair, so p99 covers every
observer. ``observer_cpu_pct`` is an observer's CPU time over the wall time of the whole join, in %
of one core (the largest of the observers).
"""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from benchmarks.core import Plan, Row, percentile, run_id
from benchmarks.procs import Child, ChildError
from consensus_api import MembershipChanged, Session, connect
from consensus_api.children import Parent, say

OBSERVERS = 2
#: Full-size members per backend: Kafka's group protocol is run at half size (issue 36).
FULL_SIZE = {"kafka": 5_000}
DEFAULT_FULL_SIZE = 10_000
QUICK_SIZE = 300
JOIN_SESSIONS = 20


def observe(url: str, group: str, size: int, parent: Parent) -> str:
    """The observer child: ``READY`` once listening; after ``START``: a JSON result once it has seen
    ``size`` members (``seen``: member index -> wall time; ``cpu_s``, ``wall_s``)."""
    seen: dict[int, float] = {}
    complete = threading.Event()
    lock = threading.Lock()

    def on_change(event: MembershipChanged) -> None:
        now = time.time()
        with lock:
            for member in event.members:
                seen.setdefault(int(member[1:]), now)
            if len(seen) >= size:
                complete.set()

    with connect(url) as session:
        session.group(group).add_listener(on_change)
        say("READY")
        if not parent.wait_for("START"):
            raise RuntimeError("no START from the parent")
        cpu, wall = time.process_time(), time.monotonic()
        if not complete.wait(max(0.0, parent.deadline - time.monotonic())):
            raise TimeoutError(f"saw {len(seen)} of {size} members in time")
        used_cpu, used_wall = time.process_time() - cpu, time.monotonic() - wall
    with lock:
        ordered = [seen[index] for index in range(size)]
    return json.dumps({"seen": ordered, "cpu_s": used_cpu, "wall_s": used_wall}, separators=(",", ":"))


def join(url: str, group: str, size: int, sessions: int, parent: Parent) -> str:
    """The joiner child: opens ``sessions`` sessions (``READY``), joins ``size`` members on ``START``;
    a JSON result with each member's join-return wall time; holds the members until stdin closes."""
    with ThreadPoolExecutor(max_workers=sessions) as pool:
        opened: list[Session] = list(pool.map(lambda _: connect(url), range(sessions)))
        try:
            say("READY")
            if not parent.wait_for("START"):
                raise RuntimeError("no START from the parent")
            joined = [0.0] * size

            def join_share(offset: int) -> None:
                handle = opened[offset].group(group)
                for index in range(offset, size, sessions):
                    handle.join(f"m{index}")
                    joined[index] = time.time()

            list(pool.map(join_share, range(sessions)))
            say("RESULT", json.dumps({"joined": joined}, separators=(",", ":")))
            while parent.next() is not None:
                pass
            return ""
        finally:
            list(pool.map(lambda session: session.close(), opened))


def run(url: str, backend: str, plan: Plan) -> list[Row]:
    """The row ``scale.observed_<n>``: join -> every observer's first sight, p50/p99 over members x
    observers, with the observers' CPU while the members join."""
    size = QUICK_SIZE if plan.quick else FULL_SIZE.get(backend, DEFAULT_FULL_SIZE)
    name = f"scale.observed_{size}"
    group = f"bench-observed-{run_id()}"
    lifetime = plan.scale_timeout
    children = [Child("observe", url, group, str(size), lifetime=lifetime) for _ in range(OBSERVERS)]
    children.append(Child("join", url, group, str(size), str(JOIN_SESSIONS), lifetime=lifetime))
    try:
        for child in children:
            child.expect("READY", 120)
        for child in children:
            child.send("START")
        joiner, observers = children[-1], children[:-1]
        joined = json.loads(joiner.expect("RESULT", lifetime)[0])["joined"]
        found = [json.loads(child.expect("RESULT", lifetime)[0]) for child in observers]
    except ChildError as exc:
        return [Row(name, None, None, note=f"failed: {exc}")]
    finally:
        for child in children:
            child.close()
    return [_row(name, joined, found)]


def _row(name: str, joined: list[float], found: list[dict[str, Any]]) -> Row:
    latencies = [max(0.0, result["seen"][i] - joined[i]) for result in found for i in range(len(joined))]
    cpu_pct = max(100 * result["cpu_s"] / result["wall_s"] for result in found)
    return Row(
        name,
        round(percentile(latencies, 50) * 1000, 1),
        round(percentile(latencies, 99) * 1000, 1),
        note=f"join -> first seen by each of {len(found)} observers; observer CPU while members join",
        extra={
            "members": len(joined),
            "observers": len(found),
            "observer_cpu_pct": round(cpu_pct, 1),
            "join_wall_s": round(max(result["wall_s"] for result in found), 1),
        },
    )
