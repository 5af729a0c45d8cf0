"""``consensus servers run NAME... -- COMMAND...``: run a command against fresh real servers."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import Any, Protocol

import click
from rich.text import Text

from consensus_api import config
from consensus_api.cli._common import err_console, expand_env
from consensus_api.errors import ConfigurationError

NAMES = ("sqlite", "postgresql", "zookeeper", "etcd", "kafka")
_COMMAND_KEY = "consensus.servers.command"


class _Server(Protocol):
    url: str

    def stop(self) -> None: ...


class _SQLiteFile:
    """``sqlite``: no server, a fresh database file in a temp dir."""

    def __init__(self) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="consensus-sqlite-"))
        self.url = f"sqlite:///{self.directory / 'consensus.db'}"

    def stop(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


class _SplitAtDashes(click.Command):
    """Everything after the first ``--`` is the COMMAND, kept out of click's parsing."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if "--" in args:
            cut = args.index("--")
            ctx.meta[_COMMAND_KEY] = args[cut + 1 :]
            args = args[:cut]
        return super().parse_args(ctx, args)


@click.group("servers")
def servers() -> None:
    """Real servers for trying and testing consensus-api."""


@servers.command("run", cls=_SplitAtDashes)
@click.argument("names", nargs=-1, required=True, type=click.Choice(NAMES))
@click.pass_context
def run(ctx: click.Context, names: tuple[str, ...]) -> None:
    """Start the servers NAMES, run COMMAND, stop the servers, exit with COMMAND's status.

    \b
    Usage: consensus servers run NAME... -- COMMAND...
    Each server's URL is exported as CONSENSUS_<NAME>_URL, and as CONSENSUS_URL
    when exactly one is named; '$CONSENSUS_URL' in COMMAND is expanded too.
    'sqlite' means a fresh temp database file, no server.
    """
    command: list[str] = ctx.meta.get(_COMMAND_KEY, [])
    if not command:
        raise click.UsageError("missing COMMAND: consensus servers run NAME... -- COMMAND...")
    if len(set(names)) != len(names):
        raise click.UsageError("each server may be named once")
    try:
        with _sigterm_raises(), _started(names) as urls:
            exports = {f"CONSENSUS_{name.upper()}_URL": url for name, url in urls.items()}
            if len(urls) == 1:
                exports["CONSENSUS_URL"] = next(iter(urls.values()))
            env = {**os.environ, **exports}
            argv = [expand_env(arg, exports, only=set(exports)) for arg in command]
            status = _run_command(argv, env)
    except _TerminatedError:
        status = 128 + signal.SIGTERM
    sys.exit(status)


@contextlib.contextmanager
def _started(names: Sequence[str]) -> Iterator[dict[str, str]]:
    """Start every server in turn (rich status on stderr); stop all of them on the way out."""
    started: list[_Server] = []
    console = err_console()
    try:
        urls: dict[str, str] = {}
        for name in names:
            with console.status(f"starting {name}…"):
                server = _start(name)
            started.append(server)
            urls[name] = server.url
            console.print(Text(f"{name} ready: {_redacted(server.url)}", style="green"))
        yield urls
    finally:
        for server in reversed(started):
            with console.status("stopping servers…"):
                server.stop()


def _start(name: str) -> _Server:
    if name == "sqlite":
        return _SQLiteFile()
    try:
        from consensus_api.testing import start_server  # noqa: PLC0415 - needs the test extra
    except ImportError as exc:
        raise ConfigurationError(
            f"starting {name} needs the test tools ({exc.name or exc}): pip install 'consensus-api[test]'"
        ) from None
    try:
        server: _Server = start_server(name)
    except (RuntimeError, ValueError) as exc:
        raise ConfigurationError(f"could not start {name}: {exc}") from None
    return server


def _run_command(argv: list[str], env: dict[str, str]) -> int:
    """Run ``argv``; on Ctrl-C wait for it (it got the SIGINT too), then terminate it."""
    try:
        process = subprocess.Popen(argv, env=env)
    except OSError as exc:
        err_console().print(Text(f"error: cannot run {argv[0]!r}: {exc.strerror or exc}", style="red"))
        return 127 if isinstance(exc, FileNotFoundError) else 126
    try:
        return _status(process.wait())
    except KeyboardInterrupt:  # the command got the SIGINT too: give it time to finish
        return _end(process, 130)
    except _TerminatedError:
        process.terminate()
        _end(process, 0)
        raise


def _end(process: subprocess.Popen[bytes], default: int) -> int:
    """Wait up to 10 s for ``process``, then SIGKILL it; its status, or ``default`` if killed."""
    with contextlib.suppress(KeyboardInterrupt, _TerminatedError):
        try:
            return _status(process.wait(timeout=10))
        except subprocess.TimeoutExpired:
            pass
    process.kill()
    process.wait()
    return default


def _status(returncode: int) -> int:
    """A shell-style exit status: 128 + N for a command killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode


class _TerminatedError(Exception):
    """This process got SIGTERM."""


@contextlib.contextmanager
def _sigterm_raises() -> Iterator[None]:
    """Turn SIGTERM into ``_TerminatedError`` so the servers get stopped (main thread only)."""

    def terminated(signum: int, frame: FrameType | None) -> Any:
        raise _TerminatedError

    try:
        previous = signal.signal(signal.SIGTERM, terminated)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _redacted(url: str) -> str:
    try:
        return config.parse_url(url)[0].redacted()
    except ConfigurationError:
        return url
