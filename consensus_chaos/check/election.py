"""Per-service election checks, and the leader handover times a report shows.

A grant is observed through a ``LeaderChanged`` event, a ``leadership()``
read or a final read; it happened no later than its first observation.
Checks: at most one leader per term; each observer's events never go back
to a lower term; a ``leadership()`` read invoked strictly after another
returned never shows a lower term (reads are linearizable); no fenced
write with term t succeeds when it was invoked after a higher term had
been observed (so had been granted); and after quiescence every settled
observer's last event equals its final read, and all final reads agree.
"""

from __future__ import annotations

from itertools import pairwise
from typing import Any

from consensus_chaos.check.ops import (
    LEADER,
    PASS,
    PROCESS,
    TERM,
    VIOLATION,
    F,
    Finding,
    Operation,
    Row,
    T,
    bar,
    point,
)

ELECTION = "election"

Observation = tuple[int, int, str, dict[str, Any]]  # time, term, leader, timeline item


def _leader_text(row: Row) -> str:
    return "no leader" if row[TERM] is None else f"{row[LEADER]} term {row[TERM]}"


def observations(ops: list[Operation], events: list[Row]) -> list[Observation]:
    """Every sighting of a (term, leader), ordered by time."""
    seen: list[Observation] = []
    for row in events:
        if row[F] in ("leader", "final") and row[TERM] is not None:
            seen.append((row[T], row[TERM], row[LEADER], point(row, f"{row[F]}: {_leader_text(row)}")))
    for op in ops:
        if op.f == "leadership" and op.outcome == "ok" and op.done is not None and op.done[TERM] is not None:
            item = bar(op, f"leadership() -> {_leader_text(op.done)}")
            seen.append((int(op.done[T]), op.done[TERM], op.done[LEADER], item))
    seen.sort(key=lambda o: o[0])
    return seen


def check_service(service: str, ops: list[Operation], events: list[Row]) -> tuple[Finding, list[int]]:
    """The election finding of one service and its handover gaps (ns)."""
    seen = observations(ops, events)
    problems = (
        _two_leaders(seen)
        + _terms_back(events)
        + _reads_back(ops)
        + _stale_fenced_writes(ops, seen)
        + _convergence(events)
    )
    finding = Finding(ELECTION, service, PASS, len(ops))
    if problems:
        finding.verdict, (finding.message, finding.timeline) = VIOLATION, problems[0]
    return finding, handover_gaps(seen, events)


def _two_leaders(seen: list[Observation]) -> list[tuple[str, list[dict[str, Any]]]]:
    first: dict[int, dict[str, Observation]] = {}
    for obs in seen:
        first.setdefault(obs[1], {}).setdefault(obs[2], obs)
    return [
        (
            f"term {term} has {len(leaders)} leaders: {', '.join(sorted(leaders))}",
            [dict(o[3], mark=True) for o in leaders.values()],
        )
        for term, leaders in sorted(first.items())
        if len(leaders) > 1
    ]


def _terms_back(events: list[Row]) -> list[tuple[str, list[dict[str, Any]]]]:
    high: dict[int, Row] = {}
    problems = []
    for row in events:
        if row[F] != "leader" or row[TERM] is None:
            continue
        top = high.get(row[PROCESS])
        if top is not None and row[TERM] < top[TERM]:
            items = [point(top, _leader_text(top)), point(row, _leader_text(row), True)]
            problems.append((f"observer {row[PROCESS]}: term {row[TERM]} after term {top[TERM]}", items))
        elif top is None or row[TERM] > top[TERM]:
            high[row[PROCESS]] = row
    return problems


def _reads_back(ops: list[Operation]) -> list[tuple[str, list[dict[str, Any]]]]:
    """Leadership reads in real-time order: a read that starts after another returned shows no lower term."""
    reads = [
        (op.call, int(op.done[T]), op.done[TERM], op)
        for op in ops
        if op.f == "leadership" and op.outcome == "ok" and op.done is not None and op.done[TERM] is not None
    ]
    by_return = sorted(reads, key=lambda read: read[1])
    problems = []
    highest: tuple[int, int, int, Operation] | None = None
    index = 0
    for call, _, term, op in sorted(reads, key=lambda read: read[0]):
        while index < len(by_return) and by_return[index][1] < call:
            if highest is None or by_return[index][2] > highest[2]:
                highest = by_return[index]
            index += 1
        if highest is not None and term < highest[2]:
            earlier = highest[3]
            items = [
                bar(earlier, f"leadership() -> term {highest[2]}"),
                bar(op, f"leadership() -> term {term}", True),
            ]
            problems.append(
                (f"leadership() read term {term} after a read had returned term {highest[2]}", items)
            )
    return problems


def _stale_fenced_writes(
    ops: list[Operation], seen: list[Observation]
) -> list[tuple[str, list[dict[str, Any]]]]:
    problems = []
    for op in ops:
        term = op.invoke[TERM]
        if term is None or op.f == "leadership" or op.outcome != "ok":
            continue
        newer = next((obs for obs in seen if obs[1] > term and obs[0] < op.call), None)
        if newer is not None:
            items = [dict(newer[3], mark=True), bar(op, f"fenced {op.f} with term {term} -> ok", True)]
            message = f"a {op.f} fenced with term {term} succeeded after term {newer[1]} had been granted"
            problems.append((message, items))
    return problems


def _convergence(events: list[Row]) -> list[tuple[str, list[dict[str, Any]]]]:
    last: dict[int, Row] = {}
    finals: list[Row] = []
    problems = []
    for row in events:
        if row[F] == "leader":
            last[row[PROCESS]] = row
        elif row[F] == "final":
            finals.append(row)
            seen = last.get(row[PROCESS])
            if seen is None or (seen[LEADER], seen[TERM]) != (row[LEADER], row[TERM]):
                items = [point(row, f"final read: {_leader_text(row)}", True)]
                items += [] if seen is None else [point(seen, f"last event: {_leader_text(seen)}", True)]
                problems.append(
                    (f"observer {row[PROCESS]}: last leader event differs from its final read", items)
                )
    if len({(row[LEADER], row[TERM]) for row in finals}) > 1:
        items = [point(row, f"final read: {_leader_text(row)}", True) for row in finals]
        problems.append(("the final leadership reads disagree", items))
    return problems


def handover_gaps(seen: list[Observation], events: list[Row]) -> list[int]:
    """For each change of term: first sighting of the new term minus the first sign the old one ended."""
    first: dict[int, int] = {}
    for when, term, _, _ in seen:
        first.setdefault(term, when)
    ended: dict[int, int] = {}
    current: dict[int, int | None] = {}
    for row in events:
        if row[F] != "leader":
            continue
        before = current.get(row[PROCESS])
        if before is not None and row[TERM] != before:
            ended[before] = min(ended.get(before, row[T]), row[T])
        current[row[PROCESS]] = row[TERM]
    terms = sorted(first)
    return [max(0, first[new] - ended[old]) for old, new in pairwise(terms) if old in ended]
