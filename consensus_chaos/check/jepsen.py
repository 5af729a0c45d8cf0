"""Reading Jepsen histories: ``jepsen.util`` log lines and EDN maps, into operations of a model.

Formats (each file is one history; line order is time order):

- ``jepsen-log``: ``INFO  jepsen.util - <process> :<type> :<f> <value>``,
  fields separated by tabs or spaces; other loggers' lines, the nemesis's
  lines (``:nemesis`` as the process: faults, not operations) and blank lines
  are skipped. No key: the history has one object.
- ``jepsen-edn``: one map per line, ``{:process 3, :type :invoke, :f :put,
  :key "7", :value "x"}`` (``:key`` optional); blank lines and the
  nemesis's maps (``:process :nemesis``) are skipped.

Guarantees: every operation has its invoke and at most one completion of the
same process and ``f``; a process has at most one operation open; values
fit the model. Anything else raises ``HistoryParseError`` with the line
number and the reason, never a guess. ``:fail`` operations never took
effect and are left out; an ``:info`` completion or none at all makes the
operation indeterminate (``ret`` None), and an indeterminate read is left
out (it has no effect).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Final

from consensus_api.errors import ConfigurationError
from consensus_chaos.check import edn, models

FORMATS: Final = ("jepsen-log", "jepsen-edn")
TYPES: Final = ("invoke", "ok", "fail", "info")
_LOG: Final = re.compile(r"^\s*\w+\s+(?P<logger>\S+)\s+-\s+(?P<rest>.*?)\s*$")
_LOG_OP: Final = re.compile(r"^(?P<process>\d+)\s+(?P<type>:\S+)\s+(?P<f>:\S+)(?:\s+(?P<value>.*))?$")
_NEMESIS_LOG: Final = re.compile(r"^:nemesis\s")
_NEMESIS_EDN: Final = re.compile(r"[{,\s]:process\s+:nemesis[\s,}]")


class HistoryParseError(ConfigurationError):
    """A history file that cannot be read; names the file, the line and the reason."""

    def __init__(self, path: Path, line: int, reason: str) -> None:
        super().__init__(f"{path}:{line}: {reason}")
        self.path, self.line, self.reason = path, line, reason


@dataclass(frozen=True, slots=True)
class Entry:
    """One line: an invoke or a completion."""

    line: int
    process: int
    type: str
    f: str
    key: str
    value: object


@dataclass(slots=True)
class ExternalOp:
    """One operation of the model: times are line numbers; ``ret`` None when indeterminate."""

    key: str
    process: int
    call: int
    ret: int | None
    op: models.Op


@lru_cache(maxsize=4096)
def _token(text: str) -> edn.Value:
    """``edn.read`` of a log line's field: a few distinct texts recur on every line."""
    return edn.read(text)


def _log_entries(text: str) -> Iterator[Entry | tuple[int, str]]:
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        match = _LOG.match(line)
        if match is None:
            yield number, "not a log line (<LEVEL> <logger> - <message>)"
            continue
        if match.group("logger") != "jepsen.util" or _NEMESIS_LOG.match(match.group("rest")):
            continue
        op = _LOG_OP.match(match.group("rest"))
        if op is None:
            yield number, "expected '<process> :<type> :<f> <value>' after 'jepsen.util -'"
            continue
        try:
            kind, f = _token(op.group("type")), _token(op.group("f"))
            value = _token(op.group("value") or "nil")
        except edn.EdnError as exc:
            yield number, str(exc)
            continue
        if not isinstance(kind, edn.Keyword) or not isinstance(f, edn.Keyword):
            yield number, "type and f must be keywords"
            continue
        yield Entry(number, int(op.group("process")), str(kind), str(f), "", value)


def _edn_entries(text: str) -> Iterator[Entry | tuple[int, str]]:
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or _NEMESIS_EDN.search(line):
            continue
        try:
            record = edn.read(line)
        except edn.EdnError as exc:
            yield number, str(exc)
            continue
        if not isinstance(record, dict):
            yield number, "expected a map {:process .., :type .., :f .., :value ..}"
            continue
        process, kind, f = (record.get(edn.Keyword(name)) for name in ("process", "type", "f"))
        key = record.get(edn.Keyword("key"), "")
        if not isinstance(process, int) or isinstance(process, bool):
            yield number, f":process must be an integer, not {process!r}"
        elif not isinstance(kind, edn.Keyword) or not isinstance(f, edn.Keyword):
            yield number, ":type and :f must be keywords"
        elif not isinstance(key, str | int) or isinstance(key, bool):
            yield number, f":key must be a string or an integer, not {key!r}"
        else:
            yield Entry(number, process, str(kind), str(f), str(key), record.get(edn.Keyword("value")))


def _scalar(value: object) -> bool:
    return isinstance(value, int | str) and not isinstance(value, bool)


def model_op(model: str, f: str, invoked: object, returned: object, ok: bool) -> models.Op | str:
    """The model operation of an invoke value and (when ``ok``) the completion's value, or the reason
    they do not fit ``model``."""
    if model == "register":
        if f == "read":
            if not ok:
                return (models.READ, None, None)
            if returned is None:
                return (models.READ, models.NIL, None)
            return (
                (models.READ, returned, None)
                if _scalar(returned)
                else "read must return nil, an integer or a string"
            )
        if f == "write":
            return (models.WRITE, invoked, None) if _scalar(invoked) else "write needs an integer or string"
        if f == "cas":
            if isinstance(invoked, tuple) and len(invoked) == 2 and _scalar(invoked[1]):
                expected = models.NIL if invoked[0] is None else invoked[0]
                if expected == models.NIL or _scalar(expected):
                    return (models.CAS, expected, invoked[1])
            return "cas needs [from to] (from nil, an integer or a string; to an integer or a string)"
        return f"the register model has read, write and cas, not :{f}"
    if f == "get":
        if not ok:
            return (models.GET, None, None)
        return (models.GET, returned, None) if isinstance(returned, str) else "get must return a string"
    if f in ("put", "append"):
        code = models.PUT if f == "put" else models.APPEND
        return (code, invoked, None) if isinstance(invoked, str) else f"{f} needs a string value"
    return f"the kv model has get, put and append, not :{f}"


def parse(path: Path, text: str, fmt: str, model: str) -> list[ExternalOp]:
    """The operations of one history file (see the module docstring)."""
    entries = _log_entries(text) if fmt == "jepsen-log" else _edn_entries(text)
    open_ops: dict[int, Entry] = {}
    ops: list[ExternalOp] = []
    for entry in entries:
        if isinstance(entry, tuple):
            raise HistoryParseError(path, *entry)
        if entry.type not in TYPES:
            raise HistoryParseError(path, entry.line, f"unknown type :{entry.type}")
        invoke = open_ops.get(entry.process)
        if entry.type == "invoke":
            if invoke is not None:
                raise HistoryParseError(
                    path, entry.line, f"process {entry.process} invokes while its line {invoke.line} is open"
                )
            if isinstance(problem := model_op(model, entry.f, entry.value, None, False), str):
                raise HistoryParseError(path, entry.line, problem)
            open_ops[entry.process] = entry
            continue
        if invoke is None or (invoke.f, invoke.key) != (entry.f, entry.key):
            raise HistoryParseError(
                path, entry.line, f"a :{entry.type} of process {entry.process} without a matching invoke"
            )
        del open_ops[entry.process]
        if entry.type == "fail":
            continue
        op = model_op(model, entry.f, invoke.value, entry.value, entry.type == "ok")
        if isinstance(op, str):
            raise HistoryParseError(path, entry.line, op)
        if entry.type == "ok" or not models.MODELS[model].constrains_only(op):
            ret = entry.line if entry.type == "ok" else None
            ops.append(ExternalOp(invoke.key, invoke.process, invoke.line, ret, op))
    for invoke in open_ops.values():  # never completed: indeterminate
        op = model_op(model, invoke.f, invoke.value, None, False)
        assert not isinstance(op, str)
        if not models.MODELS[model].constrains_only(op):
            ops.append(ExternalOp(invoke.key, invoke.process, invoke.line, None, op))
    ops.sort(key=lambda o: o.call)
    return ops


def parse_data(path: Path, data: bytes, fmt: str, model: str) -> list[ExternalOp]:
    """``parse`` of the contents ``data`` (UTF-8) of the file ``path``."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HistoryParseError(path, text_line(data, exc.start), "not UTF-8") from None
    return parse(path, text, fmt, model)


def text_line(data: bytes, offset: int) -> int:
    """The 1-based line of byte ``offset``."""
    return data.count(b"\n", 0, offset) + 1
