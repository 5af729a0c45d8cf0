"""The ``locks`` check of ``consensus check``: lock histories (``consensus chaos --workload locks``).

From each run's ``lock`` rows (:mod:`consensus_chaos.record.locks`) and its
nemesis rows, the check rebuilds when each holder held each lock: from its
``acquire`` returning a lease to its ``release`` call, its ``lost`` event (it
was told the lease ended with its session), the SIGKILL of its client slot,
or the end of the run. Per lock it reports a violation for

* **two holders at once**: a holder got the lock while another held it, and
  one of the two leases was exclusive - unless the earlier holder was fenced:
  it learnt of its loss only later (its hold ended with ``lost``, or it let go
  first and was told within ``RESUME_SLACK_NS`` of the overlap), or the
  nemesis had paused it or expired its session then; or the later one was: its
  token is the lower one and the nemesis paused or expired its client inside
  its acquire, so its grant came first and was returned late. Such a fenced overlap is
  what the lock allows (a lock lives as long as its holder's session; fencing
  tokens protect what it guards) and is counted, not a violation;
* **tokens out of order**: a lease's token is not above the token of a lease
  granted before it. A grant is known to come first when its acquire returned
  before the other acquire was called, or, when one of the two is exclusive,
  when its acquire returned first (mutual exclusion then orders the grants)
  and the nemesis did not pause or expire the other's client inside its
  acquire (a grant it got before the pause may be returned after a later one).

Like the ownership check, it runs once per run (:mod:`consensus_chaos.check.per_run`),
and its rows join the per-object checks' output (``bucket.OUTPUT_COLUMNS``).
"""

from __future__ import annotations

import json
import time
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from consensus_chaos.check import per_run
from consensus_chaos.check.bucket import STAT, SUMMARY, output_schema, spark_ddl
from consensus_chaos.check.ops import VIOLATION
from consensus_chaos.record.schema import LOCK

LOCKS = "locks"
FENCED_OVERLAP = "fenced-overlap"
KINDS = (LOCK,)
COLUMNS = (
    "run",
    "kind",
    "process",
    "client",
    "type",
    "f",
    "key",
    "value",
    "term",
    "leader",
    "op_id",
    "error",
    "time_ns",
)


@dataclass(frozen=True, slots=True)
class Hold:
    """One lease as its holder saw it: ``start`` when ``acquire`` returned, ``end`` when it stopped
    holding (None: at the end of the run), ``lost`` if it stopped because it was told of the loss,
    ``told`` when it was told (also after it let go), or None."""

    lock: str
    holder: str
    token: int
    exclusive: bool
    process: int
    slot: int
    call: int
    start: int
    end: int | None
    lost: bool
    told: int | None


def holds(rows: Iterable[Mapping[str, Any]]) -> list[Hold]:
    """Every lease of a run's rows, by ``start``."""
    rows = sorted(rows, key=lambda row: row["time_ns"])
    _, kills = per_run.fault_windows(rows)
    calls: dict[int, int] = {}
    granted: list[Mapping[str, Any]] = []
    released: dict[str, int] = {}
    told: dict[str, int] = {}
    first_seen: dict[int, int] = {}
    for row in (r for r in rows if r["kind"] == LOCK):
        first_seen.setdefault(int(row["process"]), row["time_ns"])
        f, kind = row["f"], row["type"]
        if f == "acquire" and kind == "invoke":
            calls[int(row["op_id"])] = row["time_ns"]
        elif f == "acquire" and kind == "ok":
            granted.append(row)
        elif f == "release" and kind == "invoke":
            released.setdefault(str(row["leader"]), row["time_ns"])
        elif f == "lost":
            told.setdefault(str(row["leader"]), row["time_ns"])
    found = []
    for row in granted:
        holder = str(row["leader"])
        process, slot, start = int(row["process"]), int(row["client"]), row["time_ns"]
        told_at, released_at = told.get(holder), released.get(holder)
        ends = [(at, lost) for at, lost in ((released_at, False), (told_at, True)) if at is not None]
        end, lost = min(ends) if ends else (None, False)
        killed = per_run.killed_at(slot, max(start, first_seen[process]), kills)
        if killed is not None and (end is None or killed < end):
            end, lost = killed, False
        call = calls.get(int(row["op_id"]), start)
        exclusive = row["value"] != "shared"
        found.append(
            Hold(
                row["key"],
                holder,
                int(row["term"]),
                exclusive,
                process,
                slot,
                call,
                start,
                end,
                lost,
                told_at,
            )
        )
    return sorted(found, key=lambda hold: hold.start)


def check_run(rows: Sequence[Mapping[str, Any]]) -> pa.Table:
    """The output rows (``bucket.OUTPUT_COLUMNS``) of one run's rows: per lock a finding when it is
    violated, a ``fenced-overlap`` stat per lock with fenced overlaps, one summary."""
    began = time.perf_counter()
    out: list[dict[str, Any]] = []
    if not any(row["kind"] == LOCK for row in rows):
        return pa.Table.from_pylist(out, schema=output_schema())
    run = str(rows[0]["run"])
    windows, _ = per_run.fault_windows(rows)
    by_lock: defaultdict[str, list[Hold]] = defaultdict(list)
    for hold in holds(rows):
        by_lock[hold.lock].append(hold)
    t0 = min(row["time_ns"] for row in rows)
    for lock, held in sorted(by_lock.items()):
        problems, fenced = _overlaps(held, windows, t0)
        problems += _token_order(held, windows, t0)
        if problems:
            message, timeline = problems[0]
            detail = json.dumps({"message": message, "timeline": timeline})
            out.append(
                {"run": run, "check": LOCKS, "key": lock, "verdict": VIOLATION, "ops": len(held)}
                | {"detail": detail}
            )
        if fenced:
            out.append({"run": run, "check": FENCED_OVERLAP, "key": lock, "verdict": STAT, "values": fenced})
    ms = (time.perf_counter() - began) * 1000
    summary = {"objects": len(by_lock), "ops": sum(map(len, by_lock.values())), "steps": 0, "ms": ms}
    out.append({"run": run, "check": LOCKS, "verdict": SUMMARY, **summary})
    return pa.Table.from_pylist(out, schema=output_schema())


def check_local(directory: Path) -> pa.Table:
    """``check_run`` over every run of the histories in ``directory``, in this process."""
    return per_run.check_local(directory, kinds=KINDS, columns=COLUMNS, check=check_run)


def check_spark(frame: Any) -> pa.Table:
    """``check_run`` over every run of the history DataFrame ``frame``, one Spark task per run."""
    return per_run.check_spark(frame, kinds=KINDS, columns=COLUMNS, check=check_run, ddl=spark_ddl())


Problem = tuple[str, list[dict[str, Any]]]


def _item(hold: Hold, mark: bool = True) -> dict[str, Any]:
    mode = "exclusive" if hold.exclusive else "shared"
    label = f"holds {hold.lock} ({mode}, token {hold.token}){', told of its loss' if hold.lost else ''}"
    return {
        "process": hold.process,
        "start": hold.start,
        "end": hold.end,
        "label": label,
        "mark": mark,
        "op_id": None,
    }


def _overlaps(held: list[Hold], windows: per_run.Windows, t0: int) -> tuple[list[Problem], list[int]]:
    """Two holders at once (``held`` by start): the violations, and the fenced overlaps' lengths (ns)."""
    problems: list[Problem] = []
    fenced: list[int] = []
    for index, earlier in enumerate(held):
        for later in held[index + 1 :]:
            if earlier.end is not None and later.start >= earlier.end:
                continue
            if later.holder == earlier.holder or not (earlier.exclusive or later.exclusive):
                continue
            told_late = earlier.told is not None and earlier.told <= later.start + per_run.RESUME_SLACK_NS
            returned_late = later.token < earlier.token and per_run.faulted_between(
                windows, later.slot, later.call, later.start
            )
            if (
                earlier.lost
                or told_late
                or returned_late
                or per_run.faulted(windows, earlier.slot, later.start)
            ):
                fenced.append((later.start if earlier.end is None else earlier.end) - later.start)
                continue
            until = "the end" if earlier.end is None else f"+{(earlier.end - t0) / 1e9:.3f}s"
            message = (
                f"process {later.process} (client {later.slot}) got {later.lock} (token {later.token}) at "
                f"+{(later.start - t0) / 1e9:.3f}s while process {earlier.process} (client {earlier.slot}) "
                f"held it (token {earlier.token}) until {until}, unfenced"
            )
            problems.append((message, [_item(earlier), _item(later)]))
    return problems, fenced


def _token_order(held: list[Hold], windows: per_run.Windows, t0: int) -> list[Problem]:
    """Leases whose token is not above that of a lease known to be granted before them. Mutual
    exclusion orders two grants by their acquires' returns only when the later one's client was not
    paused or expired inside its acquire: its grant may then be an older one, fenced since."""
    starts = [hold.start for hold in held]
    problems: list[Problem] = []
    for index, later in enumerate(held):
        before_call = bisect_left(starts, later.call)
        excluded = not per_run.faulted_between(windows, later.slot, later.call, later.start)
        earlier = [
            hold
            for position, hold in enumerate(held[:index])
            if position < before_call or (excluded and (hold.exclusive or later.exclusive))
        ]
        worst = max(earlier, key=lambda hold: hold.token, default=None)
        if worst is not None and worst.token >= later.token:
            message = (
                f"token {later.token} of {later.lock}, granted to process {later.process} at "
                f"+{(later.start - t0) / 1e9:.3f}s, is not above token {worst.token} granted before it"
            )
            problems.append((message, [_item(worst), _item(later)]))
    return problems
