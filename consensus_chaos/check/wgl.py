"""The Wing & Gong / Lowe linearizability search with memoization, for one object.

Guarantees: ``OK`` only if a linearization exists (``order`` holds one);
``ILLEGAL`` only if none exists; ``UNKNOWN`` when the deadline or the state
budget (cache entries) ran out first. Intervals are closed: on equal times
calls come before returns. An operation with ``ret`` None (indeterminate)
may take effect at any point after its call, or never.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Generic, TypeVar

OK: Final = "ok"
ILLEGAL: Final = "illegal"
UNKNOWN: Final = "unknown"

CHECK_EVERY: Final = 4096
_NEVER: Final = 1 << 63

S = TypeVar("S", bound=Hashable)


@dataclass(frozen=True, slots=True)
class Budget:
    """Limits of one search: wall time (seconds) and cache entries."""

    seconds: float = 10.0
    states: int = 2_000_000


@dataclass(slots=True)
class Result(Generic[S]):
    """A verdict. ``order``: for OK a linearization (ops that never took effect left out); for ILLEGAL
    the deepest partial one, ``failed_op`` could not follow it and ``state`` is the state it ends in."""

    verdict: str
    steps: int
    order: list[int] = field(default_factory=list)
    failed_op: int | None = None
    state: S | None = None
    reason: str = ""


def search(
    calls: Sequence[int],
    rets: Sequence[int | None],
    ops: Sequence[Any],
    step: Callable[[S, Any], S | None],
    *,
    initial: S,
    budget: Budget,
    deepest: bool = True,
) -> Result[S]:
    """Search a linearization of ops ``0..n-1`` (see the module docstring).

    With ``deepest`` an ILLEGAL verdict reports the deepest dead end: the search
    is run a second time, deterministically, and stopped there (cheaper than
    copying the stack at every new depth); without, only the verdict.
    """
    entries = _Entries(calls, rets)
    first, depth = entries.run(ops, step, initial, budget, capture=-1)
    if first.verdict != ILLEGAL or not deepest:
        return first
    again, _ = entries.run(ops, step, initial, budget, capture=depth)
    again.steps = first.steps
    return again


class _Entries:
    """Call and return entries in time order, as a doubly linked list (0 is the head)."""

    def __init__(self, calls: Sequence[int], rets: Sequence[int | None]) -> None:
        n = len(calls)
        times = [(calls[i], 0, i) for i in range(n)]
        for i, ret in enumerate(rets):
            times.append((_NEVER if ret is None else ret, 1, i))
        times.sort()
        size = 2 * n + 1
        self.op_of = [0] * size
        self.is_call = [False] * size
        self.match = [0] * size  # call entry -> its return entry
        self.call_entry = [0] * n
        for position, (_, kind, op) in enumerate(times, start=1):
            self.op_of[position] = op
            if kind == 0:
                self.is_call[position] = True
                self.call_entry[op] = position
            else:
                self.match[self.call_entry[op]] = position
        self.indeterminate = [r is None for r in rets]
        self.size = size

    def run(
        self, ops: Sequence[Any], step: Callable[[S, Any], S | None], initial: S, budget: Budget, capture: int
    ) -> tuple[Result[S], int]:
        """One search and its deepest dead end; stops at a dead end at depth ``capture``."""
        op_of, is_call, match, call_entry, indeterminate = (
            self.op_of, self.is_call, self.match, self.call_entry, self.indeterminate,
        )  # fmt: skip
        nxt = [*range(1, self.size), -1]
        prv = [-1, *range(self.size - 1)]
        deadline = time.monotonic() + budget.seconds
        state, linearized, steps, deepest = initial, 0, 0, -1
        cache: set[tuple[int, S]] = set()
        stack: list[tuple[int, S, bool]] = []
        entry = nxt[0]
        while nxt[0] != -1:
            steps += 1
            if steps % CHECK_EVERY == 0 and (reason := _exhausted(deadline, len(cache), budget)):
                return Result(UNKNOWN, steps, reason=reason), deepest
            op = op_of[entry]
            if is_call[entry] or indeterminate[op]:
                drop = not is_call[entry]  # the return of an indeterminate op: it never took effect
                new_state = state if drop else step(state, ops[op])
                if new_state is not None:
                    bits = linearized | (1 << op)
                    cached = len(cache)
                    cache.add((bits, new_state))
                    if len(cache) != cached:  # a new (linearized set, state): go deeper
                        call = call_entry[op]
                        stack.append((call, state, drop))
                        state, linearized = new_state, bits
                        ret = match[call]  # lift the op's entries
                        nxt[prv[call]] = nxt[call]
                        prv[nxt[call]] = prv[call]  # a return entry always follows its call
                        nxt[prv[ret]] = nxt[ret]
                        if nxt[ret] != -1:
                            prv[nxt[ret]] = prv[ret]
                        entry = nxt[0]
                        continue
                if is_call[entry]:
                    entry = nxt[entry]
                    continue
            if len(stack) == capture:
                return _partial(steps, stack, op_of, op, state), capture
            deepest = max(deepest, len(stack))
            if not stack:
                return Result(ILLEGAL, steps), deepest
            top, state, _ = stack.pop()
            linearized &= ~(1 << op_of[top])
            ret = match[top]  # unlift, in reverse order
            nxt[prv[ret]] = ret
            if nxt[ret] != -1:
                prv[nxt[ret]] = ret
            nxt[prv[top]] = top
            prv[nxt[top]] = top
            entry = nxt[top]
        return Result(OK, steps, order=[op_of[e] for e, _, drop in stack if not drop]), deepest


def _exhausted(deadline: float, cached: int, budget: Budget) -> str:
    if time.monotonic() > deadline:
        return f"time budget of {budget.seconds:g}s ran out"
    if cached > budget.states:
        return f"state budget of {budget.states} ran out"
    return ""


def _partial(
    steps: int, stack: list[tuple[int, S, bool]], op_of: list[int], failed: int, state: S
) -> Result[S]:
    """The deepest point: a partial linearization and the op that could not follow it."""
    order = [op_of[e] for e, _, drop in stack if not drop]
    return Result(ILLEGAL, steps, order=order, failed_op=failed, state=state)
