"""Rows of one object, paired into operations, and the findings a check reports.

A row is a tuple in ``COLUMNS`` order (the history columns the checks read;
the object a row belongs to is known from its group). Pairing guarantees: each operation
has its invoke row and at most one completion; an invoke without a
completion is indeterminate (``info``). A process with two operations open at
once, or a completion before its invoke, makes the history invalid.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

COLUMNS: Final = (
    "time_ns",
    "type",
    "f",
    "process",
    "op_id",
    "value",
    "version",
    "expected_version",
    "term",
    "leader",
    "members",
    "error",
)
T, TYPE, F, PROCESS, OP_ID, VALUE, VERSION, EXPECTED, TERM, LEADER, MEMBERS, ERROR = range(len(COLUMNS))

Row = tuple[Any, ...]

# Verdicts.
PASS: Final = "ok"
VIOLATION: Final = "violation"
UNKNOWN: Final = "unknown"
INVALID: Final = "invalid"


@dataclass(slots=True)
class Operation:
    """One operation: its invoke row and its completion row (None if it never completed).

    ``outcome`` is ``ok``, ``fail`` or ``info`` (also for an operation that
    never completed); ``ret`` is the completion time, None when the outcome is
    unknown.
    """

    invoke: Row
    f: str
    process: int
    call: int
    done: Row | None = None
    outcome: str = "info"
    ret: int | None = None

    @classmethod
    def invoked(cls, row: Row) -> Operation:
        return cls(row, row[F], row[PROCESS], row[T])

    def complete(self, row: Row) -> None:
        self.done, self.outcome = row, row[TYPE]
        self.ret = None if self.outcome == "info" else row[T]


@dataclass(slots=True)
class Finding:
    """The verdict of one check on one object, with what a report shows for it."""

    check: str
    key: str
    verdict: str
    ops: int
    steps: int = 0
    message: str = ""
    timeline: list[dict[str, Any]] = field(default_factory=list)


def pair(rows: Iterable[Row]) -> tuple[list[Operation], list[Row], list[str]]:
    """Operations (by invoke time), events (by time) and problems that make the history invalid.

    ``rows`` must be sorted by time."""
    ops: dict[Any, Operation] = {}
    events: list[Row] = []
    problems: list[str] = []
    for row in rows:
        kind = row[TYPE]
        if kind == "event":
            events.append(row)
        elif kind == "invoke":
            ops[row[OP_ID]] = Operation.invoked(row)
        elif (op := ops.get(row[OP_ID])) is None or op.done is not None:
            problems.append(f"op {row[OP_ID]}: a {kind} row without an open invoke")
        else:
            op.complete(row)
    operations = list(ops.values())  # in invoke order, as the rows are
    problems += sequential_problems(operations)
    return operations, events, problems


def sequential_problems(operations: Sequence[Operation]) -> list[str]:
    """Processes with overlapping operations (each process must be sequential)."""
    busy_until: dict[int, int | None] = {}
    problems = []
    for op in operations:
        if op.process in busy_until:
            until = busy_until[op.process]
            if until is None or until > op.call:
                problems.append(f"process {op.process} invoked op {op.invoke[OP_ID]} while another was open")
        busy_until[op.process] = op.ret
    return problems


def bar(op: Operation, label: str, mark: bool = False) -> dict[str, Any]:
    """A timeline item for an operation: a bar from call to return (open-ended if unknown)."""
    return {
        "process": op.process,
        "start": op.call,
        "end": op.ret,
        "label": label,
        "mark": mark,
        "op_id": op.invoke[OP_ID],
    }


def point(row: Row, label: str, mark: bool = False) -> dict[str, Any]:
    """A timeline item for an event or a read: a point at ``row``'s time."""
    return {
        "process": row[PROCESS],
        "start": row[T],
        "end": row[T],
        "label": label,
        "mark": mark,
        "op_id": None,
    }
