"""Per-group membership checks.

Member ids are unique per join and the chaos clients do not re-join after a
session loss, so each member is present during one interval. Checks: every
member seen (in a view or a read) had been joined before; each observer's
views only move forward (a member that left its views never comes back);
after quiescence each settled observer's last view equals its final read,
and all final reads agree.
"""

from __future__ import annotations

from typing import Any

from consensus_chaos.check.ops import (
    MEMBERS,
    PASS,
    PROCESS,
    VALUE,
    VIOLATION,
    F,
    Finding,
    Operation,
    Row,
    T,
    point,
)

MEMBERSHIP = "membership"


def _text(members: Any) -> str:
    return "{" + ", ".join(members or ()) + "}"


def check_group(group: str, ops: list[Operation], events: list[Row]) -> Finding:
    """The membership finding of one group."""
    joined = {op.invoke[VALUE]: op.call for op in ops if op.f == "join"}
    problems: list[tuple[str, list[dict[str, Any]]]] = []
    sightings = [row for row in events if row[F] in ("view", "final")]
    sightings += [op.done for op in ops if op.f == "members" and op.outcome == "ok" and op.done is not None]
    for row in sightings:
        unknown = [m for m in row[MEMBERS] or () if m not in joined or joined[m] > row[T]]
        if unknown:
            problems.append(
                (f"{', '.join(unknown)} seen before any join", [point(row, _text(row[MEMBERS]), True)])
            )
    previous: dict[int, Row] = {}
    gone: dict[int, set[str]] = {}
    finals: list[Row] = []
    for row in events:
        process = row[PROCESS]
        if row[F] == "view":
            before = previous.get(process)
            left = gone.setdefault(process, set())
            back = sorted(left & set(row[MEMBERS] or ()))
            if back and before is not None:
                items = [point(before, _text(before[MEMBERS])), point(row, _text(row[MEMBERS]), True)]
                problems.append((f"observer {process}: {', '.join(back)} came back after leaving", items))
            if before is not None:
                left |= set(before[MEMBERS] or ()) - set(row[MEMBERS] or ())
            previous[process] = row
        elif row[F] == "final":
            finals.append(row)
            seen = previous.get(process)
            if seen is None or sorted(seen[MEMBERS] or ()) != sorted(row[MEMBERS] or ()):
                items = [point(row, f"final read {_text(row[MEMBERS])}", True)]
                items += [] if seen is None else [point(seen, f"last view {_text(seen[MEMBERS])}", True)]
                problems.append((f"observer {process}: last view differs from its final read", items))
    if len({tuple(sorted(row[MEMBERS] or ())) for row in finals}) > 1:
        problems.append(
            ("the final membership reads disagree", [point(r, _text(r[MEMBERS]), True) for r in finals])
        )
    finding = Finding(MEMBERSHIP, group, PASS, len(ops))
    if problems:
        finding.verdict, (finding.message, finding.timeline) = VIOLATION, problems[0]
    return finding
