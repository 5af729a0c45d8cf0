"""Per-key checks: linearizability of storage operations, and the listeners' events.

Linearizability: the WGL search over the key's operations against the
versioned-register model. Listeners, per observer: versions never go back;
every event shows a value that was written (with the version that write
returned); and after quiescence the last event equals the observer's own
final read and, together with every other settled observer, a state that
ends a linearization of the key's history.
"""

from __future__ import annotations

from typing import Any

from consensus_chaos.check import versioned_register, wgl
from consensus_chaos.check.ops import (
    ERROR,
    EXPECTED,
    PASS,
    PROCESS,
    TYPE,
    UNKNOWN,
    VALUE,
    VERSION,
    VIOLATION,
    F,
    Finding,
    Operation,
    Row,
    T,
    bar,
    point,
)
from consensus_chaos.check.shrink import History, shrink

LINEARIZABILITY = "linearizability"
LISTENERS = "listeners"

_CODES = {
    "fetch": versioned_register.FETCH,
    "put": versioned_register.PUT,
    "update": versioned_register.UPDATE,
    "delete": versioned_register.DELETE,
}
_FAILURES = {
    "KeyExistsError": versioned_register.EXISTS,
    "KeyNotFoundError": versioned_register.NOT_FOUND,
    "VersionConflictError": versioned_register.CONFLICT,
}


def to_model(op: Operation) -> versioned_register.Op | None:
    """The model operation, or None for one without effect or information (a failed read, a fenced write)."""
    f, outcome, invoke = _CODES[op.f], op.outcome, op.invoke
    if f == versioned_register.FETCH:
        if outcome != "ok" or op.done is None:
            return None
        return (f, None, None, versioned_register.OK, op.done[VALUE], op.done[VERSION])
    arg, expected = invoke[VALUE], invoke[EXPECTED]
    if outcome == "info" or op.done is None:
        return (f, arg, expected, versioned_register.UNKNOWN, None, None)
    if outcome == "fail":
        result = _FAILURES.get(str(op.done[ERROR]))
        return None if result is None else (f, arg, expected, result, None, None)
    return (f, arg, expected, versioned_register.OK, None, op.done[VERSION])


def _event_text(row: Row) -> str:
    return "absent" if row[VALUE] is None else f"{row[VALUE]}@{row[VERSION]}"


def check_key(
    key: str, ops: list[Operation], events: list[Row], budget: wgl.Budget
) -> tuple[list[Finding], int]:
    """Both checks of one key; also returns the search steps."""
    history = History([(op, m) for op in ops if op.f in _CODES and (m := to_model(op)) is not None])
    for op, m in history.pairs:
        if m[0] == versioned_register.FETCH and isinstance(m[4], str) and op.ret is not None:
            history.observed[m[4]] = min(history.observed.get(m[4], op.ret), op.ret)
    for row in events:
        if row[F] in ("value", "final") and row[VALUE] is not None:
            history.observed[row[VALUE]] = min(history.observed.get(row[VALUE], row[T]), row[T])
    listener_problems, observations = _listener_problems(history, events)
    final, end = None, 0
    if observations:  # a read after everything: one point later than the key's last row
        final = (
            versioned_register.FINAL,
            None,
            None,
            versioned_register.OK,
            tuple(sorted(observations.values(), key=str)),
            None,
        )
        end = 1 + max([row[T] for row in events] + [op.done[T] if op.done else op.call for op in ops])
    result = history.search(budget, final, end)
    steps = result.steps
    lin_finding = Finding(LINEARIZABILITY, key, PASS, len(history.pairs), steps)
    if result.verdict == wgl.ILLEGAL and final is not None:
        without = history.search(budget, None, end)
        steps += without.steps
        if without.verdict == wgl.OK:
            listener_problems.append(
                (
                    "the settled listeners' last events are no final state of any linearization",
                    _final_items(observations, events),
                )
            )
        result = without
    if result.verdict == wgl.UNKNOWN:
        lin_finding.verdict, lin_finding.message = UNKNOWN, result.reason
    elif result.verdict == wgl.ILLEGAL:
        lin_finding.verdict = VIOLATION
        lin_finding.message, lin_finding.timeline = shrink(history.items(), result, budget)
    listeners = Finding(LISTENERS, key, PASS, len(events))
    if listener_problems:
        listeners.verdict = VIOLATION
        listeners.message = listener_problems[0][0]
        listeners.timeline = listener_problems[0][1]
    return [lin_finding, listeners], steps


def _final_items(observations: dict[int, tuple[Any, Any]], events: list[Row]) -> list[dict[str, Any]]:
    last = {row[PROCESS]: row for row in events if row[F] == "value"}
    return [point(last[p], f"last event {_event_text(last[p])}", True) for p in observations if p in last]


def _listener_problems(
    history: History, events: list[Row]
) -> tuple[list[tuple[str, list[dict[str, Any]]]], dict[int, tuple[Any, Any]]]:
    """Order, phantom and convergence problems, and each settled observer's last (value, version)."""
    if not events:
        return [], {}
    written: dict[str, list[Operation]] = {}  # writes that took or may have taken effect, per value
    for op, m in history.pairs:
        if m[0] in (versioned_register.PUT, versioned_register.UPDATE) and m[3] in (
            versioned_register.OK,
            versioned_register.UNKNOWN,
        ):
            written.setdefault(op.invoke[VALUE], []).append(op)
    problems: list[tuple[str, list[dict[str, Any]]]] = []
    observations: dict[int, tuple[Any, Any]] = {}
    last: dict[int, Row] = {}
    high: dict[int, Row] = {}
    for row in events:
        process, f = row[PROCESS], row[F]
        if f == "watch":
            last.pop(process, None)
        elif f == "value":
            previous, top = last.get(process), high.get(process)
            if row[VALUE] is not None and top is not None:  # a deleted key's event has no version
                if previous is None:  # a (re-)added listener's first event: the current state, maybe seen
                    back = row[VERSION] < top[VERSION]
                else:
                    same = (previous[VALUE], previous[VERSION]) == (row[VALUE], row[VERSION])
                    back = not same and row[VERSION] <= top[VERSION]
                if back:
                    items = [point(top, _event_text(top)), point(row, _event_text(row), True)]
                    message = f"observer {process}: version {row[VERSION]} after {top[VERSION]}"
                    problems.append((message, items))
            if row[VALUE] is not None:
                problems += _phantom(row, written.get(row[VALUE], []))
                if top is None or row[VERSION] > top[VERSION]:
                    high[process] = row
            last[process] = row
        elif f == "final":
            seen = last.get(process)
            if seen is None:
                problems.append(
                    (f"observer {process} got no event before the end", [point(row, "final read")])
                )
                continue
            observations[process] = (seen[VALUE], seen[VERSION])
            if (seen[VALUE], seen[VERSION]) != (row[VALUE], row[VERSION]):
                items = [
                    point(seen, f"last event {_event_text(seen)}", True),
                    point(row, f"read {_event_text(row)}"),
                ]
                problems.append((f"observer {process}: last event differs from its final read", items))
    return problems, observations


def _phantom(row: Row, writes: list[Operation]) -> list[tuple[str, list[dict[str, Any]]]]:
    """The event shows a value no write (of those writing it) had begun, or one at a version none returned."""
    begun = [write for write in writes if write.call <= row[T]]
    if not begun:
        return [
            (
                f"event shows {row[VALUE]!r}, which no write had written by then",
                [point(row, _event_text(row), True)],
            )
        ]
    versions = [w.done[VERSION] for w in begun if w.done is not None and w.done[TYPE] == "ok"]
    if len(versions) == len(begun) and row[VERSION] not in versions:
        write = begun[0]
        items = [bar(write, f"{write.f}({row[VALUE]}) -> {versions[0]}"), point(row, _event_text(row), True)]
        return [(f"event shows {row[VALUE]!r} at version {row[VERSION]}, written as {versions[0]}", items)]
    return []
