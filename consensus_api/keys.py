"""Validation of keys, names and values, done before any I/O (<https://consensus-api.github.io/consensus-api/spec/#4-storage-kip-30-storage>)."""

from __future__ import annotations

import re
from typing import Any

from consensus_api.errors import InvalidKeyError, InvalidTypeError, ValueTooLargeError

MAX_KEY_BYTES = 1024
MAX_SEGMENT_CHARS = 255
MAX_VALUE_BYTES = 1024 * 1024
#: The largest version and term: every backend stores them as signed 64-bit integers.
MAX_VERSION = 2**63 - 1
SEPARATOR = "/"
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
#: A valid ASCII key whose segments do not start with a dot (the keys most calls use), decided by
#: one match; any other key takes the checks that name what is wrong.
_PLAIN_SEGMENT = f"[^/.\x00-\x1f\x7f][^/\x00-\x1f\x7f]{{0,{MAX_SEGMENT_CHARS - 1}}}"
_PLAIN_ASCII_KEY = re.compile(f"{_PLAIN_SEGMENT}(?:/{_PLAIN_SEGMENT})*")


def check_key(key: Any, what: str = "key") -> str:
    """Return ``key`` if it is a valid key, else raise ``InvalidKeyError`` or ``InvalidTypeError``.

    A key is one or more segments joined by ``/``; each segment has 1-255
    characters, is not ``.`` or ``..`` and holds no control characters; the
    whole key is at most 1024 bytes in UTF-8.
    """
    if type(key) is str and len(key) <= MAX_KEY_BYTES and key.isascii() and _PLAIN_ASCII_KEY.fullmatch(key):
        return key
    if not isinstance(key, str):
        raise InvalidTypeError(f"{what} must be str, not {type(key).__name__}")
    try:
        size = len(key.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidKeyError(f"{what} {key!r} is not valid UTF-8: {exc.reason}") from None
    if size > MAX_KEY_BYTES:
        raise InvalidKeyError(f"{what} is {size} bytes in UTF-8; the limit is {MAX_KEY_BYTES}")
    for segment in key.split(SEPARATOR):
        _check_segment(segment, key, what)
    return key


def check_namespace(namespace: Any) -> str:
    """Return ``namespace`` if it is ``""`` (the root) or a valid key."""
    if namespace == "":
        return ""
    return check_key(namespace, "namespace")


def check_segment(name: Any, what: str) -> str:
    """Return ``name`` if it is a single valid key segment (member and candidate ids)."""
    if not isinstance(name, str):
        raise InvalidTypeError(f"{what} must be str, not {type(name).__name__}")
    if SEPARATOR in name:
        raise InvalidKeyError(f"{what} {name!r} must not contain '/'")
    _check_segment(name, name, what)
    return name


def check_value(value: Any, what: str = "value") -> bytes:
    """Return ``value`` if it is ``bytes`` of at most 1 MiB."""
    if not isinstance(value, bytes):
        raise InvalidTypeError(f"{what} must be bytes, not {type(value).__name__}")
    if len(value) > MAX_VALUE_BYTES:
        raise ValueTooLargeError(f"{what} is {len(value)} bytes; the limit is {MAX_VALUE_BYTES}")
    return value


def check_version(version: Any) -> int | None:
    """Return ``version`` if it is None or an int from 0 to ``MAX_VERSION``."""
    if version is None:
        return None
    return check_int(version, "version", 0)


def check_int(number: Any, what: str, low: int) -> int:
    """Return ``number`` if it is an int (not a bool) from ``low`` to ``MAX_VERSION``."""
    if not isinstance(number, int) or isinstance(number, bool):
        raise InvalidTypeError(f"{what} must be int, not {type(number).__name__}")
    if not low <= number <= MAX_VERSION:
        raise InvalidKeyError(f"{what} must be from {low} to 2**63-1, got {number}")
    return number


def parent_of(key: str) -> str:
    """The namespace directly above ``key`` (``""`` for a top-level key)."""
    head, _, _ = key.rpartition(SEPARATOR)
    return head


def join_key(namespace: str, name: str) -> str:
    """``name`` below ``namespace`` (the root when ``namespace`` is empty)."""
    return f"{namespace}{SEPARATOR}{name}" if namespace else name


def _check_segment(segment: str, key: str, what: str) -> None:
    if not segment:
        raise InvalidKeyError(f"{what} {key!r} has an empty segment")
    if segment in (".", ".."):
        raise InvalidKeyError(f"{what} {key!r} has a {segment!r} segment")
    if len(segment) > MAX_SEGMENT_CHARS:
        raise InvalidKeyError(
            f"{what} {key!r} has a segment of {len(segment)} characters; the limit is {MAX_SEGMENT_CHARS}"
        )
    control = _CONTROL.search(segment)
    if control is not None:
        raise InvalidKeyError(f"{what} {key!r} contains the control character {control[0]!r}")
