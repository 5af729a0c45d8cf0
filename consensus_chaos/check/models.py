"""Models the WGL search checks against, with what the shrinker needs to know about their operations.

``Model`` bundles a pure step function (state, op) -> state or None with:
which operations only constrain (reads: the shrinker may drop them), the
form of an operation left open when a history is cut (None: it goes), and
the state a completed operation fixes on its own (a blind write does).

Two models of Jepsen's histories live here (our own versioned register is
``versioned_register.VERSIONED``):

- ``REGISTER``: one register, initially ``nil`` (held as ``NIL``: a state of None
  means "impossible"); ``read`` returns the value,
  ``write v`` sets it, ``cas [from to]`` sets ``to`` if the value is ``from``.
- ``KV``: per key a string, initially ``""``; ``get`` returns it, ``put v``
  sets it, ``append v`` concatenates.

An operation of these two is ``(code, a, b)``. A completed one takes
effect between its invoke and its completion; an indeterminate one (``:info``
or no completion) at any time after its invoke, or never: the search's
business, so ``step`` only gives its effect (an indeterminate ``cas`` whose
comparison fails has no effect, the same as never taking effect, so ``step``
refuses it).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any, Final, Generic, TypeVar

S = TypeVar("S", bound=Hashable)


@dataclass(frozen=True, slots=True)
class Model(Generic[S]):
    """A model for the search and the shrinker (see the module docstring)."""

    name: str
    initial: S
    step: Callable[[S, Any], S | None]
    describe: Callable[[Any], str]
    state_text: Callable[[S], str]
    constrains_only: Callable[[Any], bool]
    left_open: Callable[[Any], Any]
    fixes: Callable[[Any], S | None]


READ: Final = 0
WRITE: Final = 1
CAS: Final = 2
GET: Final = 3
PUT: Final = 4
APPEND: Final = 5

NIL: Final = ()  # the register's nil: never a value of an operation
Op = tuple[int, Any, Any]
_NAMES: Final = {READ: "read", WRITE: "write", CAS: "cas", GET: "get", PUT: "put", APPEND: "append"}


def register_step(state: Hashable, op: Op) -> Hashable | None:
    """``REGISTER``'s step."""
    f, a, b = op
    after: Hashable | None = a if f == WRITE else None if state != a else state if f == READ else b
    return after


def kv_step(state: str, op: Op) -> str | None:
    """``KV``'s step (one key)."""
    f, a, _ = op
    if f == PUT:
        return str(a)
    if f == APPEND:
        return state + str(a)
    return state if state == a else None


def _edn(value: object) -> str:
    if value is None or value == NIL:
        return "nil"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return str(value)


def describe(op: Op) -> str:
    """E.g. ``read -> 3``, ``write 4``, ``cas [3 0]``, ``get -> "x 0 1 y"``, ``append "x 0 2 y"``."""
    f, a, b = op
    if f in (READ, GET):
        return f"{_NAMES[f]} -> {_edn(a)}"
    if f == CAS:
        return f"cas [{_edn(a)} {_edn(b)}]"
    return f"{_NAMES[f]} {_edn(a)}"


def _reads(op: Op) -> bool:
    return op[0] in (READ, GET)


def _left_open(op: Op) -> Op | None:
    return None if _reads(op) else op


def _fixes(op: Op) -> Hashable | None:
    f, a, b = op
    fixed: Hashable | None = a if f in (WRITE, PUT) else b if f == CAS else None
    return fixed


REGISTER: Final[Model[Any]] = Model(
    "register", NIL, register_step, describe, _edn, _reads, _left_open, _fixes
)
KV: Final[Model[Any]] = Model("kv", "", kv_step, describe, _edn, _reads, _left_open, _fixes)
MODELS: Final = {"register": REGISTER, "kv": KV}
