"""What every command shares: the root group, ``--url``, error handling and output helpers.

Exit codes: 0 ok; 1 a contract failure (a missing key, a version conflict, a
fenced write, a failed conformance run, ...); 2 a usage or configuration error
(click usage errors, ``ConfigurationError``, ``BackendUnavailableError``, a key
or value the API rejects before any I/O). Errors are printed in red on stderr,
without a traceback.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Callable, Mapping
from typing import Any, TypeVar
from urllib.parse import urlencode

import click
from rich.console import Console
from rich.text import Text

from consensus_api import config
from consensus_api.errors import (
    BackendUnavailableError,
    ConfigurationError,
    ConsensusError,
    InvalidKeyError,
    InvalidTypeError,
    ValueTooLargeError,
)
from consensus_api.model import Event, KeySetChanged, LeaderChanged, MembershipChanged, ValueChanged
from consensus_api.session import Session, connect

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2

#: Errors that mean "the command line or the configuration is wrong" (exit 2).
USAGE_ERRORS: tuple[type[ConsensusError], ...] = (
    ConfigurationError,
    BackendUnavailableError,
    InvalidKeyError,
    InvalidTypeError,
    ValueTooLargeError,
)

F = TypeVar("F", bound=Callable[..., Any])

_VAR_RE = re.compile(r"\$(?:\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)\}|(?P<name>[A-Za-z_][A-Za-z0-9_]*))")


def err_console() -> Console:
    """A rich console on the current stderr (looked up at use, so test runners can capture it)."""
    return Console(stderr=True, highlight=False)


def out_console() -> Console:
    """A rich console on the current stdout."""
    return Console(highlight=False)


def print_error(message: str) -> None:
    """Print ``message`` in red on stderr; never interpreted as rich markup."""
    err_console().print(Text(f"error: {message}", style="red"), soft_wrap=True)


def exit_code_for(exc: ConsensusError) -> int:
    """2 for usage and configuration errors, 1 for every other contract failure."""
    return EXIT_USAGE if isinstance(exc, USAGE_ERRORS) else EXIT_FAILURE


class ConsensusGroup(click.Group):
    """A click group that turns a ``ConsensusError`` into a red message and an exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ConsensusError as exc:
            print_error(str(exc) or type(exc).__name__)
            ctx.exit(exit_code_for(exc))


def url_option(func: F) -> F:
    """The ``--url`` option every command takes; default: the SPEC section 2 resolution."""
    return click.option(
        "--url",
        metavar="URL",
        default=None,
        help="Backend URL, e.g. etcd://127.0.0.1:2379/app. Default: $CONSENSUS_URL, "
        "then consensus.toml (or $CONSENSUS_CONFIG), then sqlite:///consensus.db.",
    )(func)


def expand_env(text: str, env: Mapping[str, str] | None = None, *, only: set[str] | None = None) -> str:
    """Replace ``$NAME`` and ``${NAME}`` by their values in ``env`` (default: the process environment).

    With ``only``, just those names are replaced and every other reference is
    left alone. Otherwise a reference to an unset variable is a ``ConfigurationError``.
    """
    values = os.environ if env is None else env

    def replace(match: re.Match[str]) -> str:
        name = match["braced"] or match["name"]
        if only is not None and name not in only:
            return match[0]
        if name not in values:
            raise ConfigurationError(f"${name} is not set (it is used in {text!r})")
        return values[name]

    return _VAR_RE.sub(replace, text)


def expand_url(url: str | None) -> str | None:
    """``url`` with environment references expanded; None stays None (the default resolution)."""
    if url is None:
        return None
    expanded = expand_env(url)
    if not expanded.strip():
        raise ConfigurationError(f"the URL {url!r} is empty")
    return expanded


def resolved_url(url: str | None) -> str:
    """One URL string that means what ``connect(url)`` means, for handing to another process.

    Without ``url`` this follows the SPEC section 2 order; options from a
    config file become query parameters (the URL's own query wins).
    """
    raw, file_options = config.resolve(expand_url(url))
    if not file_options:
        return raw
    _, query = config.parse_url(raw)
    extra = {name: _option_text(value) for name, value in file_options.items() if name not in query}
    if not extra:
        return raw
    return raw + ("&" if "?" in raw else "?") + urlencode(extra)


def _option_text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def open_session(url: str | None, **options: Any) -> Session:
    """``consensus_api.connect`` with ``url`` (environment references expanded)."""
    return connect(expand_url(url), **options)


def show_bytes(value: bytes) -> str:
    """Bytes as text: UTF-8, with undecodable bytes as backslash escapes."""
    return value.decode("utf-8", "backslashreplace")


def read_value(text: str) -> bytes:
    """A value argument: the text as UTF-8, or ``-`` for the bytes on stdin."""
    if text == "-":
        return sys.stdin.buffer.read()
    return text.encode("utf-8")


def describe(event: Event) -> str:
    """One human-readable line for an event."""
    if isinstance(event, ValueChanged):
        if event.value is None:
            return f"{event.key} deleted"
        return f"{event.key} version={event.version} value={_quoted(show_bytes(event.value))}"
    if isinstance(event, KeySetChanged):
        return f"{event.namespace or '/'} keys={json.dumps(sorted(event.keys), ensure_ascii=False)}"
    if isinstance(event, MembershipChanged):
        return f"{event.group} members={json.dumps(sorted(event.members), ensure_ascii=False)}"
    if isinstance(event, LeaderChanged):
        if event.leader_id is None:
            return f"{event.service} no leader"
        return f"{event.service} leader={event.leader_id} term={event.term}"
    raise TypeError(f"not an event: {event!r}")


def as_json(event: Event) -> dict[str, Any]:
    """An event as a JSON-ready dict with a ``type`` field."""
    if isinstance(event, ValueChanged):
        value = None if event.value is None else show_bytes(event.value)
        return {"type": "value", "key": event.key, "version": event.version, "value": value}
    if isinstance(event, KeySetChanged):
        return {"type": "keyset", "namespace": event.namespace, "keys": sorted(event.keys)}
    if isinstance(event, MembershipChanged):
        members = {member: show_bytes(data) for member, data in sorted(event.members.items())}
        return {"type": "membership", "group": event.group, "members": members}
    if isinstance(event, LeaderChanged):
        return {"type": "leader", "service": event.service, "leader": event.leader_id, "term": event.term}
    raise TypeError(f"not an event: {event!r}")


def _quoted(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)
