"""A reader for the part of EDN that Jepsen histories use: maps, vectors, lists, strings, integers,
keywords, ``nil``, ``true`` and ``false``.

Guarantee: ``read`` returns the one value the text holds or raises ``EdnError``
naming what it could not read; it never guesses (floats, tags, sets, symbols
other than ``nil``/``true``/``false`` and trailing text are refused).
Keywords come back as ``Keyword`` (a ``str`` subclass holding the name without
its colon), vectors and lists as tuples, maps as dicts.
"""

from __future__ import annotations

import re
from typing import Final

Value = object


class EdnError(ValueError):
    """Text that is not one value of the EDN subset above."""


class Keyword(str):
    """An EDN keyword such as ``:ok`` (held as ``"ok"``)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f":{self}"


_TOKEN: Final = re.compile(
    r"""[\s,]*(?:
        (?P<open>[\[({])|(?P<close>[\])}])
        |"(?P<string>(?:[^"\\]|\\.)*)"
        |:(?P<keyword>[^\s,\[\](){}"]+)
        |(?P<int>[-+]?\d+)(?![\w.])
        |(?P<symbol>nil|true|false)(?![^\s,\[\](){}])
        |(?P<end>$)
    )""",
    re.VERBOSE,
)
_ESCAPES: Final = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\"}
_CLOSERS: Final = {"[": "]", "(": ")", "{": "}"}
_SYMBOLS: Final = {"nil": None, "true": True, "false": False}


def _unescape(text: str) -> str:
    return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m.group(1), "\0" + m.group(1)), text)


def read(text: str) -> Value:
    """The single value in ``text`` (see the module docstring)."""
    value, position = _value(text, 0)
    match = _TOKEN.match(text, position)
    if match is None or match.group("end") is None:
        raise EdnError(f"unexpected text after the value at column {position + 1}")
    return value


def _value(text: str, position: int) -> tuple[Value, int]:
    match = _TOKEN.match(text, position)
    if match is None or match.group("end") is not None or match.group("close") is not None:
        found = "the end of the line" if match is not None and match.group("end") is not None else "this"
        raise EdnError(f"expected a value at column {position + 1}, found {found}: {text[position:][:20]!r}")
    end = match.end()
    if (opener := match.group("open")) is not None:
        return _collection(text, end, opener)
    if (string := match.group("string")) is not None:
        unescaped = _unescape(string)
        if "\0" in unescaped:
            raise EdnError(f"unknown escape in the string at column {match.start('string')}")
        return unescaped, end
    if (keyword := match.group("keyword")) is not None:
        return Keyword(keyword), end
    if (number := match.group("int")) is not None:
        return int(number), end
    return _SYMBOLS[match.group("symbol")], end


def _collection(text: str, position: int, opener: str) -> tuple[Value, int]:
    items: list[Value] = []
    while True:
        match = _TOKEN.match(text, position)
        if match is not None and match.group("close") is not None:
            if match.group("close") != _CLOSERS[opener]:
                raise EdnError(
                    f"{match.group('close')!r} at column {match.start('close') + 1} closes {opener!r}"
                )
            position = match.end()
            break
        item, position = _value(text, position)
        items.append(item)
    if opener != "{":
        return tuple(items), position
    if len(items) % 2:
        raise EdnError("a map with an odd number of forms")
    try:
        mapping = dict(zip(items[::2], items[1::2], strict=True))
    except TypeError:
        raise EdnError("a map key that is a map") from None
    if len(mapping) != len(items) // 2:
        raise EdnError("a map with a repeated key")
    return mapping, position
