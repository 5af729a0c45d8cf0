"""``consensus servers run NAME... -- COMMAND...``: run a command against fresh real servers;
``consensus servers install NAME...``: install what they need on the machine."""

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
from consensus_api.cli._common import EXIT_USAGE, err_console, expand_env, out_console
from consensus_api.errors import ConfigurationError
from consensus_testkit import prerequisites, start_store
from consensus_testkit.launchers import (
    SQLITE,
    launcher,
    require_launchers,
    secure_names,
    server_names,
    start_cluster,
)
from consensus_testkit.process import ServerHandle

CONTROL_ENV = "CONSENSUS_CONTROL"
_COMMAND_KEY = "consensus.servers.command"


class _Server(Protocol):
    url: str

    def stop(self) -> None: ...

    def write_control(self, path: Path) -> None: ...


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
@click.argument("names", nargs=-1, required=True, type=click.Choice((SQLITE, *server_names())))
@click.option(
    "--secure",
    is_flag=True,
    help="Start the TLS and password variants (servers whose launcher has one): certificates made at start, "
    "the URL names the user, password and tls_ca.",
)
@click.option(
    "--nodes",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Start a replicated cluster of this many nodes (odd, at least 3), where the launcher starts them.",
)
@click.pass_context
def run(ctx: click.Context, names: tuple[str, ...], secure: bool, nodes: int) -> None:
    """Start the servers NAMES, run COMMAND, stop the servers, exit with COMMAND's status.

    \b
    Usage: consensus servers run NAME... -- COMMAND...
    Each server's URL is exported as CONSENSUS_<NAME>_URL, and as CONSENSUS_URL
    when exactly one is named; '$CONSENSUS_URL' in COMMAND is expanded too,
    unless the URL holds a password (the consensus commands expand it themselves).
    Each server's control file (JSON: PID, command, ports, data dir; read by
    consensus_testkit.control.attach, so COMMAND may kill, pause and
    restart the server) is exported as CONSENSUS_<NAME>_CONTROL, and as
    CONSENSUS_CONTROL when exactly one is named. A launcher may export more
    (spark: CONSENSUS_SPARK_MASTER, the executors' PYSPARK_PYTHON). At the end the
    servers are stopped, also one that COMMAND restarted.
    'sqlite' means a fresh temp database file, no server and no control file.
    --secure starts each server's TLS and password variant (its URL, with the
    password, reaches COMMAND only through the environment).
    --nodes 3 starts one server NAME as a replicated cluster: the URL names every
    node, the control file (consensus_testkit.control.attach)
    names each node, its own control file and URL, and the links between the
    nodes, so COMMAND may kill, pause, resume, restart and isolate each node
    and ask which one leads.
    A server whose client library or binary is missing is one line naming what to install (exit 2).
    """
    command: list[str] = ctx.meta.get(_COMMAND_KEY, [])
    if not command:
        raise click.UsageError("missing COMMAND: consensus servers run NAME... -- COMMAND...")
    if len(set(names)) != len(names):
        raise click.UsageError("each server may be named once")
    require_launchers(names)
    insecure = sorted(name for name in names if secure and (name == "sqlite" or not launcher(name).secure))
    if insecure:
        raise click.UsageError(
            f"no secure variant of {', '.join(insecure)}; secure servers: {', '.join(secure_names())}"
        )
    if nodes > 1:
        if len(names) != 1 or names[0] == "sqlite" or launcher(names[0]).cluster is None or secure:
            raise click.UsageError(
                "--nodes starts one server whose launcher starts clusters, without --secure"
            )
        if nodes < 3 or nodes % 2 == 0:
            raise click.UsageError(f"--nodes must be odd and at least 3, got {nodes}")
    try:
        with _sigterm_raises(), _started(names, secure, nodes) as (urls, controls, extra):
            exports = {f"CONSENSUS_{name.upper()}_URL": url for name, url in urls.items()}
            exports.update(extra)
            exports.update(
                {f"CONSENSUS_{name.upper()}_CONTROL": str(path) for name, path in controls.items()}
            )
            if len(urls) == 1:
                exports["CONSENSUS_URL"] = next(iter(urls.values()))
            env = {**os.environ, **exports}
            env.pop(CONTROL_ENV, None)
            if len(urls) == 1 and controls:
                env[CONTROL_ENV] = exports[CONTROL_ENV] = str(next(iter(controls.values())))
            # A URL with a password stays a reference ('$CONSENSUS_URL'): the consensus CLI and shells
            # expand it from the environment, and it stays off the command line, which ps shows.
            clear = {name for name, value in exports.items() if config.redact_text(value) == value}
            argv = [expand_env(arg, exports, only=clear) for arg in command]
            status = _run_command(argv, env)
    except _TerminatedError:
        status = 128 + signal.SIGTERM
    sys.exit(status)


@contextlib.contextmanager
def _started(
    names: Sequence[str], secure: bool, nodes: int = 1
) -> Iterator[tuple[dict[str, str], dict[str, Path], dict[str, str]]]:
    """Start every server in turn (rich status on stderr); stop all of them on the way out.

    Yields the URLs and the control files (servers only) by name, and the variables the
    launchers export besides (``Launcher.environment``).
    """
    started: list[_Server] = []
    console = err_console()
    controls_dir = Path(tempfile.mkdtemp(prefix="consensus-control-"))
    try:
        urls: dict[str, str] = {}
        controls: dict[str, Path] = {}
        extra: dict[str, str] = {}
        for name in names:
            with console.status(f"starting {name}…" if nodes == 1 else f"starting {nodes} {name} nodes…"):
                server = _start(name, secure, nodes)
            started.append(server)
            urls[name] = server.url
            control = controls_dir / f"{name}.json"
            server.write_control(control)
            if control.exists():
                controls[name] = control
            environment = launcher(name).environment if name != SQLITE else None
            if environment is not None and isinstance(server, ServerHandle):
                extra.update(environment(server))
            console.print(Text(f"{name} ready: {_redacted(server.url)}", style="green"))
        yield urls, controls, extra
    finally:
        for server in reversed(started):
            with console.status("stopping servers…"):
                server.stop()
        shutil.rmtree(controls_dir, ignore_errors=True)


def _start(name: str, secure: bool, nodes: int) -> _Server:
    try:
        server: _Server = start_cluster(name, nodes) if nodes > 1 else start_store(name, secure=secure)
    except ModuleNotFoundError as exc:
        raise ConfigurationError(f"could not start {name}: {exc.name or exc} is not installed") from None
    except (RuntimeError, ValueError) as exc:
        raise ConfigurationError(f"could not start {name}: {exc}") from None
    return server


@servers.command("install")
@click.argument("names", nargs=-1, required=True, type=click.Choice((SQLITE, *server_names())))
@click.option(
    "--yes",
    "run_apt",
    is_flag=True,
    help="Run apt-get for the Debian packages (as root) instead of printing the line to run.",
)
def install(names: tuple[str, ...], run_apt: bool) -> None:
    """Install what the servers NAMES need on the machine; a second run only checks.

    \b
    Debian packages (PostgreSQL, MariaDB, ZooKeeper, Redis, Java, Maven): the
    apt-get line to run as root is printed, or run with --yes. Jars and binaries
    go into the cache dir ($CONSENSUS_CACHE or ~/.cache/consensus-api): Kafka's
    jars are fetched with Maven, etcd is built with Go (about 2 minutes the first
    time). Exit 2 while something is still missing (each line says what to do),
    1 when a fetch or build fails.
    """
    needs = [need for name in names if name != SQLITE for need in launcher(name).needs]
    out = out_console()
    try:
        left = prerequisites.install(
            needs, run_apt=run_apt, say=lambda line: out.print(Text(line), soft_wrap=True)
        )
    except RuntimeError as exc:
        raise click.ClickException(str(exc)) from None
    for line in left:
        err_console().print(Text(f"missing: {line}", style="red"), soft_wrap=True)
    if left:
        sys.exit(EXIT_USAGE)


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
