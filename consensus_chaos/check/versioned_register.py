"""The versioned-register model of one key, as a pure step function for the WGL search.

State: ``(value, version, floor)``. ``value`` None means the key is absent.
``version`` None with a value present means "some version above ``floor``"
(after an operation whose outcome is unknown); versions only have to
increase, as on every backend (etcd's revisions, for instance, jump).
``floor`` is the highest version the key is known to have had.

An operation is a tuple ``(f, arg, expected, result, out_value, out_version)``.
``step`` returns the state after the operation, or None if the operation
cannot take effect with that output in that state. It never mutates.
An indeterminate operation (``UNKNOWN``) is given only its effect here; that
it may never have happened is the search's business.
"""

from __future__ import annotations

from typing import Any, Final

from consensus_chaos.check.models import Model

FETCH: Final = 0
PUT: Final = 1
UPDATE: Final = 2
DELETE: Final = 3
FINAL: Final = 4  # the settled listeners' last events, all at the end of the history

OK: Final = 0
EXISTS: Final = 1
NOT_FOUND: Final = 2
CONFLICT: Final = 3
UNKNOWN: Final = 4

State = tuple[str | None, int | None, int]
Op = tuple[int, str | None, int | None, int, object, int | None]

INITIAL: Final[State] = (None, None, -1)
NAMES: Final = {FETCH: "fetch", PUT: "put", UPDATE: "update", DELETE: "delete", FINAL: "final"}
RESULTS: Final = {OK: "ok", EXISTS: "KeyExists", NOT_FOUND: "KeyNotFound", CONFLICT: "VersionConflict"}


def _read(state: State, value: str | None, version: int | None) -> State | None:
    current, known, floor = state
    if value is None:
        return state if current is None else None
    if value != current or version is None:
        return None
    if known is None:  # pin the unknown version
        return (current, version, version) if version > floor else None
    return state if known == version else None


def step(state: State, op: Op) -> State | None:
    """The state after ``op``, or None if ``op`` with its output is impossible in ``state``."""
    f, arg, expected, result, out_value, out_version = op
    if f == FETCH:
        return _read(state, out_value if isinstance(out_value, str) else None, out_version)
    if f == FINAL:
        assert isinstance(out_value, tuple)
        first = out_value[0]
        if any(seen != first for seen in out_value):
            return None
        return _read(state, first[0], first[1])
    value, version, floor = state
    if f == PUT:
        if result == EXISTS:
            return state if value is not None else None
        if value is not None:
            return None
        if result == OK:
            return (
                (arg, out_version, out_version) if out_version is not None and out_version > floor else None
            )
        return (arg, None, floor)
    # update or delete
    if result == NOT_FOUND:
        return state if value is None else None
    if value is None:
        return None
    if expected is not None:
        if version is None:
            if result == CONFLICT:
                return state  # the unknown version may differ from ``expected``
            if expected <= floor:
                return None
            current = expected
        elif version != expected:
            return state if result == CONFLICT else None
        else:
            current = version
    else:
        current = floor if version is None else version
    if result == CONFLICT:
        return None
    if f == DELETE:
        return (None, None, current)
    if result == OK:
        return (arg, out_version, out_version) if out_version is not None and out_version > current else None
    return (arg, None, current)


def describe(op: Op) -> str:
    """A short human-readable form, e.g. ``update(v3, if 7) -> 8`` or ``put(v1) -> KeyExists``."""
    f, arg, expected, result, out_value, out_version = op
    args = [a for a in (arg, None if expected is None else f"if {expected}") if a is not None]
    call = f"{NAMES[f]}({', '.join(args)})"
    if f == FINAL:
        return f"{call} -> listeners at {out_value}"
    if result == UNKNOWN:
        return f"{call} -> ?"
    if f == FETCH:
        return f"{call} -> {'absent' if out_value is None else f'{out_value}@{out_version}'}"
    if result != OK:
        return f"{call} -> {RESULTS[result]}"
    return f"{call} -> {'ok' if out_version is None else out_version}"


def _constrains_only(op: Op) -> bool:
    return op[0] == FETCH or op[3] in (EXISTS, NOT_FOUND, CONFLICT)


def _left_open(op: Op) -> Op | None:
    """A write still open where a history is cut: indeterminate; a read or a failed write goes."""
    if op[0] == FETCH or op[0] == FINAL or op[3] in (EXISTS, NOT_FOUND, CONFLICT):
        return None
    return (op[0], op[1], op[2], UNKNOWN, None, None)


def _fixes(op: Op) -> State | None:
    f, arg, _, result, _, version = op
    if f not in (PUT, UPDATE) or result != OK:
        return None
    return (arg, version, version if version is not None else -1)


def state_text(state: State) -> str:
    """``absent``, ``value@version`` or ``value@>floor``."""
    value, version, floor = state
    if value is None:
        return "absent"
    return f"{value}@{version if version is not None else f'>{floor}'}"


VERSIONED: Final[Model[Any]] = Model(
    "versioned", INITIAL, step, describe, state_text, _constrains_only, _left_open, _fixes
)
