"""A key's history as the WGL search sees it, and the shrinking of a violation to a small slice.

The shrinker works for any ``models.Model``. Every reduction keeps a
history only if it is still not linearizable, and each is sound (a
linearizable history stays linearizable under it), so the slice is itself a proof of the violation:

1. cut at the failing operation's return: later operations go, open writes
   become indeterminate, open reads and failed writes go;
2. drop reads and failed writes (they only constrain), chunk by chunk;
3. start at the latest completed write that fixes the state on its own
   (a put or update; a blind write), overlaps nothing left and precedes the
   failing operation: the operations before it go.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from consensus_chaos.check import versioned_register, wgl
from consensus_chaos.check.models import Model
from consensus_chaos.check.ops import Operation, bar

SHRINK_SECONDS = 2.0

Item = tuple[Operation, Any, int, int | None]  # operation, model op, call, return
Illegal = Callable[[list[Item], Any], bool]


@dataclass(slots=True)
class History:
    """The operations of one key that the model sees, with their model form.

    ``observed`` maps a written value to the first time it was seen (a read's
    return, an event's arrival). A write whose outcome is unknown but whose
    value was seen took effect before that when no other operation wrote the
    same value: it gets that time as its return, which is sound and keeps it
    from staying open forever. A value written more than once gives no such
    hint (the sighting may be of the other write): the write stays open.
    """

    pairs: list[tuple[Operation, versioned_register.Op]]
    observed: dict[str, int] = field(default_factory=dict)

    def items(self) -> list[Item]:
        writers = Counter(
            m[1] for _, m in self.pairs if m[0] in (versioned_register.PUT, versioned_register.UPDATE)
        )
        return [(op, m, op.call, self._ret(op, m, writers)) for op, m in self.pairs]

    def _ret(self, op: Operation, m: versioned_register.Op, writers: Counter[str | None]) -> int | None:
        if m[3] != versioned_register.UNKNOWN:
            return op.ret
        if m[1] is None or writers[m[1]] != 1:  # a delete, or a value written more than once
            return None
        seen = self.observed.get(m[1])  # the put's or update's value
        return seen if seen is not None and seen > op.call else None

    def search(
        self, budget: wgl.Budget, final: versioned_register.Op | None, end: int
    ) -> wgl.Result[versioned_register.State]:
        """Search the key's history, with ``final`` (if any) as a read at time ``end``."""
        items = self.items()
        calls, rets, ops = [i[2] for i in items], [i[3] for i in items], [i[1] for i in items]
        if final is not None:
            calls.append(end)
            rets.append(end)
            ops.append(final)
        return wgl.search(
            calls, rets, ops, versioned_register.step, initial=versioned_register.INITIAL, budget=budget
        )


def search_items(
    items: list[Item], initial: Any, budget: wgl.Budget, step: Any, deepest: bool = True
) -> wgl.Result[Any]:
    """The WGL search over ``items`` from ``initial`` (``deepest``: see ``wgl.search``)."""
    calls, rets, ops = [i[2] for i in items], [i[3] for i in items], [i[1] for i in items]
    return wgl.search(calls, rets, ops, step, initial=initial, budget=budget, deepest=deepest)


def shrink(
    items: list[Item],
    result: wgl.Result[Any],
    budget: wgl.Budget,
    kind: Model[Any] = versioned_register.VERSIONED,
) -> tuple[str, list[dict[str, Any]]]:
    """A message naming the failing operation, and the timeline of a small violating slice.

    ``items`` are those ``result`` (ILLEGAL) came from, in the same order."""
    assert result.failed_op is not None
    failed = items[result.failed_op]
    deadline = time.monotonic() + SHRINK_SECONDS
    small = wgl.Budget(seconds=min(budget.seconds, SHRINK_SECONDS), states=budget.states)

    def illegal(trial: list[Item], initial: Any = kind.initial) -> bool:
        if time.monotonic() >= deadline:
            return False
        return search_items(trial, initial, small, kind.step, deepest=False).verdict == wgl.ILLEGAL

    if failed[3] is not None:
        cut = _truncate(items, failed, failed[3], kind)
        items = cut if illegal(cut) else items
    removable = [i for i in items if i is not failed and kind.constrains_only(i[1])]
    chunk = max(1, len(removable) // 2)
    while removable and time.monotonic() < deadline:
        for start in range(0, len(removable), chunk):
            drop = {id(i) for i in removable[start : start + chunk]}
            trial = [i for i in items if id(i) not in drop]
            if drop and illegal(trial):
                items = trial
        removable = [i for i in removable if any(i is j for j in items)]
        if chunk == 1:
            break
        chunk = max(1, chunk // 2)
    initial, items = _start_at_fixed_state(items, failed, illegal, kind)
    op, m = failed[0], failed[1]
    state = "unknown" if result.state is None else kind.state_text(result.state)
    message = (
        f"{kind.describe(m)} by process {op.process} cannot be linearized "
        f"(longest valid prefix: {len(result.order)} ops, ending in state {state}); "
        f"slice of {len(items)} ops" + ("" if initial == kind.initial else " from a fixed state")
    )
    timeline = [bar(i[0], kind.describe(i[1]), i is failed) for i in sorted(items, key=lambda i: i[2])]
    return message, timeline


def _truncate(items: list[Item], failed: Item, until: int, kind: Model[Any]) -> list[Item]:
    """The history up to ``until``: operations still open then become indeterminate writes or go."""
    cut: list[Item] = []
    for item in items:
        op, m, call, ret = item
        if call > until:
            continue
        if item is failed or (ret is not None and ret <= until):
            cut.append(item)
        elif (still_open := kind.left_open(m)) is not None:
            cut.append((op, still_open, call, None))
    return cut


def _start_at_fixed_state(
    items: list[Item], failed: Item, illegal: Illegal, kind: Model[Any]
) -> tuple[Any, list[Item]]:
    """Step 3 of the module docstring; the initial state and the items of the slice."""
    for item in sorted(items, key=lambda i: -i[2]):
        _, m, call, ret = item
        if ret is None or ret >= failed[2] or (state := kind.fixes(m)) is None:
            continue
        if any(j is not item and j[2] <= ret and (j[3] is None or j[3] >= call) for j in items):
            continue  # overlaps another operation
        after = [j for j in items if j[2] > ret]
        if illegal(after, state):
            return state, [item, *after]
    return kind.initial, items
