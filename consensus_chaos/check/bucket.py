"""The per-bucket function both engines run: Arrow rows of many objects in, findings out.

Input: history rows plus ``okind`` (kv, election, group, nemesis) and
``object`` (the key, service or group; fenced writes appear both under their
key and under their service); ``members`` arrives joined by newlines (list
columns make Spark's Arrow batching quadratic). Output: ``OUTPUT_COLUMNS``
rows, one ``summary`` per run and check, one row per finding that is not
``ok``, and ``stat`` rows (a latency histogram per operation,
``checker.histogram``, so the output stays small however long the history;
leader handover gaps per service; fault counts). Verdicts depend only on each
object's rows, never on how objects are bucketed.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc

from consensus_chaos.check import wgl
from consensus_chaos.check.election import ELECTION, check_service
from consensus_chaos.check.histogram import Histogram
from consensus_chaos.check.kv import LINEARIZABILITY, LISTENERS, check_key
from consensus_chaos.check.membership import MEMBERSHIP, check_group
from consensus_chaos.check.ops import COLUMNS, INVALID, MEMBERS, PASS, TYPE, F, Finding, Operation, T, pair
from consensus_chaos.record.schema import ELECTION_OPS

OUTPUT_COLUMNS: Final = {
    "run": "string",
    "check": "string",
    "key": "string",
    "verdict": "string",
    "objects": "bigint",
    "ops": "bigint",
    "steps": "bigint",
    "ms": "double",
    "detail": "string",
    "values": "array<bigint>",
}
INPUT_COLUMNS: Final = ("run", "okind", "object", *COLUMNS)
MEMBERS_SEPARATOR: Final = "\n"  # member ids are key segments: no control characters
CHECKS: Final = {"kv": (LINEARIZABILITY, LISTENERS), "election": (ELECTION,), "group": (MEMBERSHIP,)}
SUMMARY: Final = "summary"
STAT: Final = "stat"
LATENCY: Final = "latency"


def output_schema() -> Any:
    """The Arrow schema of the output."""
    types = {
        "string": pa.string(),
        "bigint": pa.int64(),
        "double": pa.float64(),
        "array<bigint>": pa.list_(pa.int64()),
    }
    return pa.schema([(name, types[kind]) for name, kind in OUTPUT_COLUMNS.items()])


def spark_ddl() -> str:
    """The output schema as a Spark DDL string."""
    return ", ".join(f"`{name}` {kind}" for name, kind in OUTPUT_COLUMNS.items())


@dataclass
class _Totals:
    objects: int = 0
    ops: int = 0
    steps: int = 0
    ms: float = 0.0


@dataclass
class _Output:
    rows: list[dict[str, Any]] = field(default_factory=list)
    totals: dict[tuple[str, str], _Totals] = field(default_factory=lambda: defaultdict(_Totals))
    stats: dict[tuple[str, str, str], list[int]] = field(default_factory=lambda: defaultdict(list))
    latencies: dict[tuple[str, str], Histogram] = field(default_factory=lambda: defaultdict(Histogram))

    def add(self, run: str, finding: Finding, ms: float) -> None:
        totals = self.totals[(run, finding.check)]
        totals.objects += 1
        totals.ops += finding.ops
        totals.steps += finding.steps
        totals.ms += ms
        if finding.verdict != PASS:
            detail = json.dumps({"message": finding.message, "timeline": finding.timeline})
            self.rows.append(
                {
                    "run": run,
                    "check": finding.check,
                    "key": finding.key,
                    "verdict": finding.verdict,
                    "ops": finding.ops,
                    "steps": finding.steps,
                    "ms": ms,
                    "detail": detail,
                }
            )

    def table(self) -> Any:
        for (run, check), t in self.totals.items():
            self.rows.append(
                {
                    "run": run,
                    "check": check,
                    "verdict": SUMMARY,
                    "objects": t.objects,
                    "ops": t.ops,
                    "steps": t.steps,
                    "ms": t.ms,
                }
            )
        stats = [
            *self.stats.items(),
            *(((run, LATENCY, f), h.encode()) for (run, f), h in self.latencies.items()),
        ]
        for (run, check, key), values in stats:
            self.rows.append({"run": run, "check": check, "key": key, "verdict": STAT, "values": values})
        return pa.Table.from_pylist(self.rows, schema=output_schema())


def check_table(table: Any, budget: wgl.Budget) -> Any:
    """Check every object in ``table`` (a ``pyarrow.Table`` with ``INPUT_COLUMNS``)."""
    table = table.select(list(INPUT_COLUMNS))
    table = table.append_column(
        "completes", pc.not_equal(table.column("type"), "invoke")
    )  # invokes first on ties
    order = [(name, "ascending") for name in ("run", "okind", "object", "time_ns", "completes")]
    table = table.sort_by(order)
    rows = list(zip(*(table.column(name).to_pylist() for name in COLUMNS), strict=True))
    ends = object_ends(table)
    firsts = table.select(["run", "okind", "object"]).take([0, *ends[:-1]]) if ends else table
    idents = zip(*(firsts.column(name).to_pylist() for name in ("run", "okind", "object")), strict=True)
    out = _Output()
    start = 0
    for end, ident in zip(ends, idents, strict=True):
        _check_object(out, ident, rows[start:end], budget)
        start = end
    return out.table()


def object_ends(table: Any) -> list[int]:
    """The end offsets of the runs of equal (run, okind, object) in a table sorted by them."""
    if table.num_rows == 0:
        return []
    ident = pc.binary_join_element_wise(
        table.column("run"), table.column("okind"), pc.fill_null(table.column("object"), ""), "\x00"
    )
    return list(pc.run_end_encode(ident.combine_chunks()).run_ends.to_pylist())


def _check_object(out: _Output, ident: tuple[str, str, str], rows: list[Any], budget: wgl.Budget) -> None:
    run, kind, name = ident
    if kind == "nemesis":
        for row in rows:
            if row[TYPE] == "invoke":
                out.stats[(run, "fault", str(row[F]))].append(row[T])
        return
    began = time.perf_counter()
    ops, events, problems = pair(_decode_members(rows) if kind == "group" else rows)
    if problems:
        for check in CHECKS[kind]:
            out.add(run, Finding(check, name, INVALID, len(ops), message="; ".join(problems[:3])), 0.0)
        return
    findings: list[Finding]
    if kind == "kv":
        findings, steps = check_key(name, ops, events, budget)
        findings[0].steps = steps
        _latencies(out, run, ops)
    elif kind == "election":
        finding, gaps = check_service(name, ops, events)
        findings = [finding]
        out.stats[(run, "handover", name)].extend(gaps)
        _latencies(out, run, [op for op in ops if op.f in ELECTION_OPS])
    else:
        findings = [check_group(name, ops, events)]
        _latencies(out, run, ops)
    ms = (time.perf_counter() - began) * 1000 / len(findings)
    for finding in findings:
        out.add(run, finding, ms)


def _decode_members(rows: list[Any]) -> list[Any]:
    """Rows with ``members`` split back into lists."""
    split = [
        None if row[MEMBERS] is None else [m for m in row[MEMBERS].split(MEMBERS_SEPARATOR) if m]
        for row in rows
    ]
    return [(*row[:MEMBERS], members, *row[MEMBERS + 1 :]) for row, members in zip(rows, split, strict=True)]


def _latencies(out: _Output, run: str, ops: list[Operation]) -> None:
    by_f: defaultdict[str, list[int]] = defaultdict(list)
    for op in ops:
        ret = op.ret
        if ret is not None:
            by_f[op.f].append(ret - op.call)
    for f, values in by_f.items():
        out.latencies[(run, f)].add_all(values)
