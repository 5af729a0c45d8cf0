"""Resource ownership in a coordinator history (``consensus chaos --workload coordinator``).

From each run's ``coordinator`` events (``assigned`` / ``revoked`` / ``final`` /
``subscribed``, see :mod:`consensus_chaos.record.ownership`) and its nemesis
rows, the check rebuilds when each process owned each resource: from
``assigned`` to ``revoked``, or to the SIGKILL of its client slot, or to the
end of the run. It reports

* ``double-ownership``: a process started a resource another process still
  owned - a violation;
* ``fenced-overlap``: the same, but the earlier owner was fenced: the nemesis
  had paused it or expired its session then, or it stopped the resource only
  when told its membership was lost (its ``revoked`` names generation -1).
  A member that outlived ``rebalance_timeout`` or its session is allowed by
  the protocol (as in Kafka): reported, not a violation;
* ``unowned-at-end`` / ``owned-twice-at-end``: the ``final`` records (what
  each live member owned once the group was quiet) leave a subscribed
  resource without an owner, or give it two - violations.

``check_run`` is the per-run function; ``check_spark`` runs it with Spark
(``groupBy(run).applyInArrow``), ``check_local`` without.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from consensus_chaos.check import per_run
from consensus_chaos.check.spark import history_frame
from consensus_chaos.check.spark_io import history_url, readable

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
    "members",
    "op_id",
    "time_ns",
)
KINDS = ("coordinator",)
FINDING_DDL = "run string, resource string, finding string, detail string"
VIOLATIONS = frozenset({"double-ownership", "unowned-at-end", "owned-twice-at-end"})


@dataclass(frozen=True, slots=True)
class Finding:
    """One finding of a run about one resource."""

    run: str
    resource: str
    finding: str
    detail: str

    @property
    def violation(self) -> bool:
        return self.finding in VIOLATIONS


@dataclass(frozen=True, slots=True)
class _Owning:
    process: int
    slot: int
    start: int
    end: int | None  # None: still owned at the end of the run
    lost: bool = False  # revoked when told the membership was lost (generation -1)


def check_run(rows: Iterable[Mapping[str, Any]]) -> list[Finding]:
    """The findings of one run's rows (see the module docstring)."""
    rows = sorted(rows, key=lambda row: row["time_ns"])
    if not rows:
        return []
    run, t0 = str(rows[0]["run"]), rows[0]["time_ns"]
    windows, kills = per_run.fault_windows(rows)
    slot_of: dict[int, int] = {}
    first_seen: dict[int, int] = {}
    owning: dict[tuple[int, str], int] = {}
    spans: defaultdict[str, list[_Owning]] = defaultdict(list)
    finals: dict[int, list[str]] = {}
    universe: set[str] = set()
    for row in (r for r in rows if r["kind"] == "coordinator"):
        process, f, resource = int(row["process"]), row["f"], row["key"]
        slot_of[process] = int(row["client"])
        first_seen.setdefault(process, row["time_ns"])
        if f == "subscribed":
            universe.update(_names(row["members"]))
        elif f == "final":
            finals[process] = _names(row["members"])
        elif f == "assigned" and (process, resource) not in owning:
            owning[(process, resource)] = row["time_ns"]
        elif f == "revoked" and (process, resource) in owning:
            start, lost = owning.pop((process, resource)), row["term"] in (None, -1)
            spans[resource].append(_Owning(process, slot_of[process], start, row["time_ns"], lost))
    for (process, resource), start in owning.items():
        end = per_run.killed_at(slot_of[process], max(start, first_seen[process]), kills)
        spans[resource].append(_Owning(process, slot_of[process], start, end))

    def at(time_ns: int) -> str:
        return f"+{(time_ns - t0) / 1e9:.3f}s"

    findings: list[Finding] = []
    for resource, owned in sorted(spans.items()):
        for later in owned:
            for earlier in owned:
                if earlier.process == later.process or not earlier.start <= later.start:
                    continue
                if earlier.end is not None and later.start >= earlier.end:
                    continue
                faulted = per_run.faulted(windows, earlier.slot, later.start)
                fenced = faulted or earlier.lost
                until = "the end" if earlier.end is None else at(earlier.end)
                detail = (
                    f"process {later.process} (client {later.slot}) started {resource} at {at(later.start)} "
                    f"while process {earlier.process} (client {earlier.slot}) owned it "
                    f"from {at(earlier.start)} to {until}"
                )
                if faulted:
                    detail += "; the nemesis had paused it or expired its session"
                elif fenced:
                    detail += "; it stopped when told its membership was lost"
                kind = "fenced-overlap" if fenced else "double-ownership"
                findings.append(Finding(run, resource, kind, detail))
    if finals:
        holders: defaultdict[str, list[int]] = defaultdict(list)
        for process, owned_at_end in sorted(finals.items()):
            for resource in owned_at_end:
                holders[resource].append(process)
        for resource in sorted(universe | set(holders)):
            owners = holders.get(resource, [])
            if not owners:
                findings.append(Finding(run, resource, "unowned-at-end", "no live member owns it at the end"))
            elif len(owners) > 1:
                findings.append(
                    Finding(run, resource, "owned-twice-at-end", f"processes {owners} own it at the end")
                )
    return findings


def check_local(directory: Path) -> list[Finding]:
    """``check_run`` over every run of the histories in ``directory``, in this process."""
    return _findings(per_run.check_local(directory, kinds=KINDS, columns=COLUMNS, check=_check_table))


def check_spark(location: Path | str, session: Any) -> list[Finding]:
    """``check_run`` over every run of the histories at ``location`` (a directory or a URL Spark reads),
    one Spark task per run."""
    url = history_url(location)
    with readable(url):
        frame = history_frame(session, url)
        table = per_run.check_spark(frame, kinds=KINDS, columns=COLUMNS, check=_check_table, ddl=FINDING_DDL)
    return _findings(table)


def _check_table(rows: list[Any]) -> pa.Table:
    found = check_run(rows)
    names = ("run", "resource", "finding", "detail")
    schema = pa.schema([(name, pa.string()) for name in names])
    return pa.table({name: [getattr(f, name) for f in found] for name in names}, schema=schema)


def _findings(table: pa.Table) -> list[Finding]:
    return [Finding(**row) for row in table.to_pylist()]


def _names(members: Any) -> list[str]:
    if members is None:
        return []
    if isinstance(members, str):
        return [name for name in members.split(",") if name]
    return [str(name) for name in members]
