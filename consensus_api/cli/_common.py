"""What every command shares: the root group, ``--url``, error handling and output helpers.

Exit codes: 0 ok; 1 a contract failure (a missing key, a version conflict, a
fenced write, a failed conformance run, ...); 2 a usage or configuration error
(click usage errors, ``ConfigurationError``, ``BackendUnavailableError``, a key
or value the API rejects before any I/O). Errors are printed in red on stderr,
without a traceback.
"""

from __future__ import annotations

import base64
import functools
import importlib.util
import json
import os
import re
import sys
from collections.abc import Callable, Iterable, Mapping
from importlib.metadata import EntryPoint, entry_points
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
from consensus_api.registry import load_backend, load_entry
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

#: What ``show_text`` escapes: C0 controls (NUL, ESC, ...), DEL, C1 controls, the line and
#: paragraph separators and the bidirectional embeddings, overrides and isolates.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_UNSAFE_IN_LINES = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")

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


#: The entry-point group of commands beyond the runtime's (the test kit's, the chaos tools', ...).
COMMAND_GROUP = "consensus_api.commands"


@functools.cache
def _command_entry_points() -> dict[str, EntryPoint]:
    return {ep.name: ep for ep in entry_points(group=COMMAND_GROUP)}


def _unavailable(name: str, why: str) -> click.Command:
    """A command that could not be loaded: listed with why, and running it prints why (exit 2)."""

    def explain() -> None:
        print_error(why)
        sys.exit(EXIT_USAGE)

    return click.Command(
        name,
        callback=explain,
        short_help=f"(unavailable: {why.rpartition(': ')[2]})",
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
        add_help_option=False,
    )


class ConsensusGroup(click.Group):
    """A click group that turns a ``ConsensusError`` into a red message and an exit code.

    Besides its own commands it lists every command installed in the entry-point
    group ``consensus_api.commands`` and imports one only when it runs (a missing
    extra is one line naming what to install, exit 2).
    """

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *_command_entry_points()})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        command = super().get_command(ctx, cmd_name)
        if command is not None or cmd_name not in _command_entry_points():
            return command
        try:
            loaded = load_entry(_command_entry_points(), cmd_name, "command")
        except ConfigurationError as exc:
            return _unavailable(cmd_name, str(exc))
        if not isinstance(loaded, click.Command):
            return _unavailable(cmd_name, f"the command {cmd_name!r} is {loaded!r}, not a click command")
        return loaded

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ConsensusError as exc:
            print_error(str(exc) or type(exc).__name__)
            ctx.exit(exit_code_for(exc))


#: Where the root group keeps a ``--url`` given before the sub-command (``click.Context.meta`` is
#: shared by every context of one invocation).
_ROOT_URL = "consensus_api.cli.url"

URL_HELP = (
    "Backend URL, e.g. etcd://127.0.0.1:2379/app. Default: $CONSENSUS_URL, "
    "then consensus.toml (or $CONSENSUS_CONFIG), then sqlite:///consensus.db."
)


def _keep_root_url(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    if value is not None:
        ctx.meta[_ROOT_URL] = value


def root_url_option(func: F) -> F:
    """``--url`` before the sub-command (``consensus --url URL kv get K``): every command that takes
    ``--url`` or a URL argument uses it unless given its own."""
    return click.option(
        "--url", metavar="URL", default=None, expose_value=False, callback=_keep_root_url, help=URL_HELP
    )(func)


def given_url(url: str | None) -> str | None:
    """``url``, else the ``--url`` given before the sub-command, else None (the default resolution)."""
    if url is not None:
        return url
    ctx = click.get_current_context(silent=True)
    return None if ctx is None else ctx.meta.get(_ROOT_URL)


def url_option(func: F) -> F:
    """The ``--url`` option every command takes (after the sub-command; the root group's otherwise);
    default: resolved as ``connect()`` resolves it (<https://consensus-api.github.io/consensus-api/spec/#2-connecting>)."""
    return click.option(
        "--url",
        metavar="URL",
        default=None,
        callback=lambda _ctx, _param, value: given_url(value),
        help=URL_HELP,
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
            raise ConfigurationError(f"${name} is not set (it is used in {config.redact_text(text)!r})")
        return values[name]

    return _VAR_RE.sub(replace, text)


def expand_url(url: str | None) -> str | None:
    """``url`` with environment references expanded; None stays None (the default resolution)."""
    if url is None:
        return None
    expanded = expand_env(url)
    if not expanded.strip():
        raise ConfigurationError(f"the URL {config.redact_text(url)!r} is empty")
    return expanded


def resolved_url(url: str | None) -> str:
    """One URL string that means what ``connect(url)`` means, for handing to another process.

    Without ``url`` this follows the order of <https://consensus-api.github.io/consensus-api/spec/#2-connecting>;
    options from a config file become query parameters (the URL's own query wins).
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


def open_session(url: str | None, *, read_only: bool = False, **options: Any) -> Session:
    """``consensus_api.connect`` with ``url`` (environment references expanded).

    ``read_only``: the command only looks, so a SQLite database file that does
    not exist is a ``ConfigurationError`` (exit 2) instead of being created.
    """
    expanded = expand_url(url)
    if read_only:
        _require_existing_database(expanded)
    return connect(expanded, **options)


def _require_existing_database(url: str | None) -> None:
    """``ConfigurationError`` when ``url`` (resolved as ``connect`` does) names storage that opening
    would create (``Backend.missing_storage``); the URL's own errors (options, ranges) are raised
    first, as ``connect`` would."""
    raw, file_options = config.resolve(url)
    parsed, query = config.parse_url(raw)
    backend = load_backend(parsed.scheme)
    missing = backend.missing_storage(parsed)
    if missing is None:
        return
    config.build_options({**file_options, **query}, backend.options, parsed.scheme, parsed)
    raise ConfigurationError(
        f"no database at {missing} ({parsed.redacted()}): a read-only command does not create one; "
        "give --url, set $CONSENSUS_URL or write consensus.toml"
    )


def show_text(text: str, *, keep_lines: bool = False) -> str:
    """``text`` safe for a terminal: control characters (C0 with NUL and ESC, DEL, C1), line
    separators and bidirectional overrides become visible escapes (``\\x1b``, ``\\u202e``).

    With ``keep_lines``, newline and tab stay as they are (a multi-line value keeps its lines).
    """
    pattern = _UNSAFE_IN_LINES if keep_lines else _UNSAFE
    return pattern.sub(_escape, text)


def show_bytes(value: bytes, *, keep_lines: bool = False) -> str:
    """Bytes for a terminal: UTF-8 with undecodable bytes as ``\\xNN``, then ``show_text``."""
    return show_text(value.decode("utf-8", "backslashreplace"), keep_lines=keep_lines)


def json_bytes(value: bytes) -> tuple[str, str]:
    """Bytes for JSON: ``(text, "utf-8")`` when ``value`` is valid UTF-8, else ``(base64, "base64")``."""
    try:
        return value.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        return base64.b64encode(value).decode("ascii"), "base64"


def json_text(document: object) -> str:
    """``document`` as one line of JSON with no character a terminal would act on (see ``show_text``)."""
    return _UNSAFE.sub(lambda match: f"\\u{ord(match[0]):04x}", json.dumps(document, ensure_ascii=False))


def echo_json(document: object) -> None:
    """Print ``document`` as one JSON document on stdout."""
    click.echo(json_text(document))


def require_extra(extra: str, modules: Iterable[str], purpose: str) -> None:
    """``ConfigurationError`` naming ``consensus-api[extra]`` when one of ``modules`` (top-level
    import names) is not installed; looks them up without importing them, before any work."""
    missing = [name for name in modules if importlib.util.find_spec(name) is None]
    if missing:
        raise ConfigurationError(
            f"{purpose} needs {', '.join(missing)} (not installed): pip install 'consensus-api[{extra}]'"
        )


def read_value(text: str) -> bytes:
    """A value argument: the text as UTF-8, or ``-`` for the bytes on stdin."""
    if text == "-":
        return sys.stdin.buffer.read()
    return text.encode("utf-8")


def describe(event: Event, *, was_present: bool = True) -> str:
    """One human-readable line for an event, safe for a terminal; a key without a value is
    ``deleted`` if it ``was_present`` before this event, else ``absent``."""
    if isinstance(event, ValueChanged):
        if event.value is None:
            return f"{show_text(event.key)} {'deleted' if was_present else 'absent'}"
        value = json_text(event.value.decode("utf-8", "backslashreplace"))
        return f"{show_text(event.key)} version={event.version} value={value}"
    if isinstance(event, KeySetChanged):
        return f"{show_text(event.namespace) or '/'} keys={json_text(sorted(event.keys))}"
    if isinstance(event, MembershipChanged):
        return f"{show_text(event.group)} members={json_text(sorted(event.members))}"
    if isinstance(event, LeaderChanged):
        if event.leader_id is None:
            return f"{show_text(event.service)} no leader"
        return f"{show_text(event.service)} leader={show_text(event.leader_id)} term={event.term}"
    raise TypeError(f"not an event: {event!r}")


def as_json(event: Event) -> dict[str, Any]:
    """An event as a JSON-ready dict with a ``type`` field; bytes as ``json_bytes`` encodes them."""
    if isinstance(event, ValueChanged):
        value, encoding = (None, None) if event.value is None else json_bytes(event.value)
        return {
            "type": "value",
            "key": event.key,
            "version": event.version,
            "value": value,
            "encoding": encoding,
        }
    if isinstance(event, KeySetChanged):
        return {"type": "keyset", "namespace": event.namespace, "keys": sorted(event.keys)}
    if isinstance(event, MembershipChanged):
        return {"type": "membership", "group": event.group, "members": member_list(event.members)}
    if isinstance(event, LeaderChanged):
        return {"type": "leader", "service": event.service, "leader": event.leader_id, "term": event.term}
    raise TypeError(f"not an event: {event!r}")


def member_list(members: Mapping[str, bytes]) -> list[dict[str, str]]:
    """Members sorted by id, each ``{"member", "data", "encoding"}`` (see ``json_bytes``)."""
    listed = []
    for member_id in sorted(members):
        data, encoding = json_bytes(members[member_id])
        listed.append({"member": member_id, "data": data, "encoding": encoding})
    return listed


def _escape(match: re.Match[str]) -> str:
    code = ord(match[0])
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
