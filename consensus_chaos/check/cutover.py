"""The checks of a cut-over history (``consensus chaos --workload cutover``): a migration under faults.

Clients on bridged sessions (:mod:`consensus_chaos.record.cutover`) increment counters with
compare-and-set, run an election and take a lock, and write fenced by their leadership or lease,
while the runner moves authority from the old store to the new one half-way (``migration`` rows)
and, at the end, reads the new store's counters directly (``final`` events). Each client operation
says which store served it (``store``: ``old``, ``new``, null when authority moved during the call).
Per run:

* ``cutover``: the cut-over completed, and the new store's final state was recorded;
* ``cutover-writes``, per counter: every acknowledged increment is on the new store at the end
  (its value is at most the final one), no increment is acknowledged twice (that would be a lost
  update: two writers each believed it added one), and the final value was written by an increment;
* ``cutover-leaders``, per service and lock: at most one leader (holder) per term (token);
* ``cutover-tokens``, per service and lock: every term and token is below 2^63, each one the new
  store issued is above every one the old store issued, and lock tokens rise in grant order wherever
  real time fixes it (an acquire that returned before another was called came first);
* ``cutover-fencing``, per service and lock: no fenced write is acknowledged when it was invoked
  after a higher term (token) had been observed, nor when its fence (term and holder) was granted
  by the old store and it was invoked after the cut-over completed (a deposed leader or a lost lock
  writing).

Like the locks check it runs once per run (:mod:`consensus_chaos.check.per_run`), in this process
or as one Spark task per run, and its rows join the other checks' output.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pyarrow as pa

from consensus_chaos.check import per_run
from consensus_chaos.check.bucket import SUMMARY, output_schema, spark_ddl
from consensus_chaos.check.ops import VIOLATION
from consensus_chaos.record.schema import (
    CUTOVER,
    INVOKE,
    MIGRATION,
    NEW_STORE,
    OK,
    OLD_STORE,
    OUT_OF_RANGE,
    TOKEN_LIMIT,
)

DONE: Final = "cutover"
WRITES: Final = "cutover-writes"
LEADERS: Final = "cutover-leaders"
TOKENS: Final = "cutover-tokens"
FENCING: Final = "cutover-fencing"
CHECKS: Final = (DONE, WRITES, LEADERS, TOKENS, FENCING)
KINDS = (CUTOVER, MIGRATION)
COLUMNS = (
    "run",
    "kind",
    "process",
    "client",
    "type",
    "f",
    "key",
    "value",
    "version",
    "term",
    "service",
    "leader",
    "op_id",
    "error",
    "time_ns",
    "store",
)
#: Operations whose ``ok`` shows a term (token) as granted: leadership reads and lock acquires.
GRANTS: Final = frozenset({"leadership", "acquire"})

Row = Mapping[str, Any]
Problem = tuple[str, list[dict[str, Any]]]


@dataclass(frozen=True, slots=True)
class Op:
    """One operation: its invoke row and its completion (None: it never completed)."""

    invoke: Row
    done: Row | None

    @property
    def ok(self) -> bool:
        return self.done is not None and self.done["type"] == OK

    @property
    def call(self) -> int:
        return int(self.invoke["time_ns"])

    @property
    def ret(self) -> int | None:
        """When it returned, for an ``ok`` or ``fail``; None when its outcome is unknown."""
        if self.done is None or self.done["type"] not in (OK, "fail"):
            return None
        return int(self.done["time_ns"])

    @property
    def store(self) -> str | None:
        return None if self.done is None else self.done["store"]

    def item(self, label: str, mark: bool = True) -> dict[str, Any]:
        """This operation as a timeline item of a finding."""
        end = None if self.done is None else self.done["time_ns"]
        return {"process": self.invoke["process"], "start": self.call, "end": end, "label": label} | {
            "mark": mark,
            "op_id": self.invoke["op_id"],
        }


@dataclass(frozen=True, slots=True)
class Sighting:
    """A term (token) of a service (lock) seen granted at ``at``: by an ``ok`` grant or a leader event."""

    name: str
    term: int
    leader: str | None
    at: int
    store: str | None
    item: dict[str, Any]


def operations(rows: Iterable[Row]) -> list[Op]:
    """The operations among ``rows`` (by invoke time)."""
    invokes: dict[int, Row] = {}
    done: dict[int, Row] = {}
    for row in rows:
        if row["op_id"] is None:
            continue
        if row["type"] == INVOKE:
            invokes[int(row["op_id"])] = row
        else:
            done[int(row["op_id"])] = row
    return sorted((Op(row, done.get(op_id)) for op_id, row in invokes.items()), key=lambda op: op.call)


def sightings(ops: Sequence[Op], events: Sequence[Row]) -> list[Sighting]:
    """Every term seen granted, with when and where (by time)."""
    seen = []
    for op in ops:
        if op.ok and op.invoke["f"] in GRANTS and op.done is not None and op.done["term"] is not None:
            term, leader = int(op.done["term"]), op.done["leader"]
            item = op.item(f"{op.invoke['f']} -> {leader} term {term} ({op.store or 'store unknown'})")
            seen.append(Sighting(op.invoke["service"], term, leader, int(op.done["time_ns"]), op.store, item))
    for row in events:
        if row["f"] == "leader" and row["term"] is not None:
            point = {"process": row["process"], "start": row["time_ns"], "end": row["time_ns"], "op_id": None}
            item = point | {"label": f"leader event: {row['leader']} term {row['term']}", "mark": True}
            seen.append(Sighting(row["service"], int(row["term"]), row["leader"], row["time_ns"], None, item))
    return sorted(seen, key=lambda sighting: sighting.at)


def check_run(rows: Sequence[Row]) -> pa.Table:
    """The output rows (``bucket.OUTPUT_COLUMNS``) of one run: a finding per violated object, one
    summary per check."""
    if not any(row["kind"] == CUTOVER for row in rows):
        return pa.Table.from_pylist([], schema=output_schema())
    began = time.perf_counter()
    run = str(rows[0]["run"])
    ordered = sorted(rows, key=lambda row: row["time_ns"])
    client = [row for row in ordered if row["kind"] == CUTOVER]
    driver = [row for row in ordered if row["kind"] == MIGRATION]
    ops, migration = operations(client), operations(driver)
    events = [row for row in client if row["type"] == "event"]
    finals = {row["key"]: row for row in driver if row["type"] == "event" and row["f"] == "final"}
    cut = min((op.ret for op in migration if op.ok and op.invoke["f"] == "cutover" and op.ret), default=None)
    seen = sightings(ops, events)
    t0 = ordered[0]["time_ns"]
    results: dict[str, dict[str, list[Problem]]] = {
        DONE: {"migration": _completed(cut, finals, ops)},
        WRITES: _writes(ops, finals, t0),
        LEADERS: _leaders(seen),
        TOKENS: _tokens(ops, seen),
        FENCING: _fencing(ops, seen, cut, t0),
    }
    out: list[dict[str, Any]] = []
    ms = (time.perf_counter() - began) * 1000 / len(results)
    for check, objects in results.items():
        for name, problems in sorted(objects.items()):
            if problems:
                message, timeline = problems[0]
                detail = json.dumps({"message": message, "timeline": timeline})
                finding = {"run": run, "check": check, "key": name, "verdict": VIOLATION}
                out.append(finding | {"ops": len(problems), "detail": detail})
        summary = {"objects": len(objects), "ops": len(ops) + len(migration), "steps": 0, "ms": ms}
        out.append({"run": run, "check": check, "verdict": SUMMARY} | summary)
    return pa.Table.from_pylist(out, schema=output_schema())


def check_local(directory: Path) -> pa.Table:
    """``check_run`` over every run of the histories in ``directory``, in this process."""
    return per_run.check_local(directory, kinds=KINDS, columns=COLUMNS, check=check_run)


def check_spark(frame: Any) -> pa.Table:
    """``check_run`` over every run of the history DataFrame ``frame``, one Spark task per run."""
    return per_run.check_spark(frame, kinds=KINDS, columns=COLUMNS, check=check_run, ddl=spark_ddl())


def _completed(cut: int | None, finals: Mapping[str, Row], ops: Sequence[Op]) -> list[Problem]:
    if cut is None:
        return [("the cut-over never completed: authority stayed on the old store", [])]
    counters = {op.invoke["key"] for op in ops if op.invoke["f"] == "cas"}
    if counters and not finals:
        return [("the new store's final state was not recorded", [])]
    return []


def _writes(ops: Sequence[Op], finals: Mapping[str, Row], t0: int) -> dict[str, list[Problem]]:
    """Per counter: acknowledged increments on the new store at the end, none acknowledged twice."""
    by_key: defaultdict[str, list[Op]] = defaultdict(list)
    for op in ops:
        if op.invoke["f"] == "cas":
            by_key[op.invoke["key"]].append(op)
    found: dict[str, list[Problem]] = {}
    for key, cas in by_key.items():
        problems: list[Problem] = []
        acked: dict[int, Op] = {}
        for op in cas:
            value = int(op.invoke["value"])
            if op.ok and value in acked:
                first = acked[value]
                items = [first.item(f"cas -> {value}: ok"), op.item(f"cas -> {value}: ok")]
                message = (
                    f"the increment to {value} was acknowledged twice (process {first.invoke['process']} "
                    f"and process {op.invoke['process']} at +{(op.call - t0) / 1e9:.3f}s): an update was lost"
                )
                problems.append((message, items))
            elif op.ok:
                acked[value] = op
        final = finals.get(key)
        if acked and final is None:
            problems.append((f"no final read of {key} on the new store", []))
        elif final is not None:
            held = 0 if final["value"] is None else int(final["value"])
            top = max(acked, default=0)
            point = {
                "process": final["process"],
                "start": final["time_ns"],
                "end": final["time_ns"],
                "op_id": None,
            }
            final_item = point | {"label": f"final on the new store: {held}", "mark": True}
            if top > held:
                items = [
                    acked[top].item(f"cas -> {top}: ok ({acked[top].store or 'store unknown'})"),
                    final_item,
                ]
                message = f"the acknowledged increment to {top} is not on the new store, which holds {held}"
                problems.append((message, items))
            written = {int(op.invoke["value"]) for op in cas if op.done is None or op.done["type"] != "fail"}
            if held and held not in written:
                problems.append((f"the new store holds {held}, which no increment wrote", [final_item]))
        found[key] = problems
    return found


def _names(ops: Sequence[Op], seen: Sequence[Sighting]) -> set[str]:
    return {s.name for s in seen} | {op.invoke["service"] for op in ops if op.invoke["service"] is not None}


def _leaders(seen: Sequence[Sighting]) -> dict[str, list[Problem]]:
    """Per service and lock: at most one leader (holder) per term (token)."""
    firsts: defaultdict[str, dict[int, dict[str, Sighting]]] = defaultdict(dict)
    for sighting in seen:
        if sighting.leader is not None:
            firsts[sighting.name].setdefault(sighting.term, {}).setdefault(sighting.leader, sighting)
    found: dict[str, list[Problem]] = {}
    for name, terms in firsts.items():
        found[name] = [
            (
                f"term {term} has {len(leaders)} leaders: {', '.join(sorted(leaders))}",
                [s.item for s in leaders.values()],
            )
            for term, leaders in sorted(terms.items())
            if len(leaders) > 1
        ]
    return found


def _tokens(ops: Sequence[Op], seen: Sequence[Sighting]) -> dict[str, list[Problem]]:
    """Per service and lock: terms in range, the new store's above the old's, locks' in grant order."""
    found: dict[str, list[Problem]] = {name: [] for name in _names(ops, seen)}
    for op in ops:
        done = op.done
        if done is not None and str(done["error"] or "").startswith(OUT_OF_RANGE):
            problem = (f"{done['error']} (a term must stay below 2^63)", [op.item(str(done["error"]))])
            found.setdefault(op.invoke["service"] or op.invoke["key"], []).append(problem)
    for sighting in seen:
        if not 0 <= sighting.term < TOKEN_LIMIT:
            found[sighting.name].append((f"term {sighting.term} is out of range", [sighting.item]))
    by_store: defaultdict[tuple[str, str], list[Sighting]] = defaultdict(list)
    for sighting in seen:
        if sighting.store in (OLD_STORE, NEW_STORE):
            by_store[(sighting.name, str(sighting.store))].append(sighting)
    for name, problems in found.items():
        old = max(by_store.get((name, OLD_STORE), []), key=lambda s: s.term, default=None)
        new = min(by_store.get((name, NEW_STORE), []), key=lambda s: s.term, default=None)
        if old is not None and new is not None and new.term <= old.term:
            message = f"term {new.term} issued by the new store is not above term {old.term} of the old one"
            problems.append((message, [old.item, new.item]))
    granted = [(op, _token(op)) for op in ops if op.invoke["f"] == "acquire" and op.ok and _token(op) >= 0]
    for later, token in granted:
        lock = later.invoke["key"]
        before = [(op, t) for op, t in granted if op.invoke["key"] == lock and (op.ret or 0) < later.call]
        worst, top = max(before, key=lambda pair: pair[1], default=(None, -1))
        if worst is not None and top >= token:
            message = f"token {token} of {lock} was granted after token {top}, not above it"
            items = [worst.item(f"acquire -> token {top} ({worst.store})"), later.item(f"acquire -> {token}")]
            found.setdefault(lock, []).append((message, items))
    return found


def _token(op: Op) -> int:
    """The term of an ``ok`` grant; -1 when it was out of range (reported on its own)."""
    assert op.done is not None
    return -1 if op.done["term"] is None else int(op.done["term"])


def _fencing(
    ops: Sequence[Op], seen: Sequence[Sighting], cut: int | None, t0: int
) -> dict[str, list[Problem]]:
    """Per service and lock: no acknowledged write fenced by a deposed leadership or a lost lease."""
    found: dict[str, list[Problem]] = {name: [] for name in _names(ops, seen)}
    old_fences = {(s.name, s.term, s.leader) for s in seen if s.store == OLD_STORE}
    for op in ops:
        if op.invoke["f"] != "write" or not op.ok:
            continue
        name, term = op.invoke["service"], int(op.invoke["term"])
        label = f"write {op.invoke['key']} fenced with term {term} -> ok ({op.store or 'store unknown'})"
        newer = next((s for s in seen if s.name == name and s.term > term and s.at < op.call), None)
        if newer is not None:
            message = (
                f"a write fenced with term {term} of {name} was accepted at +{(op.call - t0) / 1e9:.3f}s, "
                f"after term {newer.term} had been granted"
            )
            found[name].append((message, [newer.item, op.item(label)]))
        elif cut is not None and op.call > cut and (name, term, op.invoke["leader"]) in old_fences:
            message = (
                f"a write fenced with term {term} of {name}, issued by the old store, was accepted "
                f"+{(op.call - cut) / 1e9:.3f}s after the cut-over completed"
            )
            found[name].append((message, [op.item(label)]))
    return found
