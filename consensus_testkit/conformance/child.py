"""The parent's handle on a child process of the suite (a worker or a coordinator member).

The child is ``python -m MODULE ARGS --lifetime S [--opt NAME=VALUE ...]``
with ``$CONSENSUS_URL`` set; it reports by printing lines and takes commands
on stdin. Every line is kept (with its arrival time) in an ``EventLog``, and
the end of its output shows as ``EOF_LINE``; the child is killed by PID and
reaped by ``close``, also when a test fails. The child's side: ``child_options``, ``child_parser``
and ``child_start`` (a watchdog ends it, whatever happens, once its lifetime is over).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from consensus_api.closing import Closing
from consensus_testkit.conformance.helpers import EVENT_TIMEOUT, EventLog

EOF_LINE = "<eof>"

#: The exit code of a child its watchdog ended.
WATCHDOG_EXIT = 3


def child_options(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """``parser`` with the options of every child: ``--opt NAME=VALUE``... (session options) and
    ``--lifetime S``."""
    parser.add_argument("--opt", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--lifetime", type=float, default=120.0)
    return parser


def child_parser(module: str) -> tuple[argparse.ArgumentParser, argparse.ArgumentParser, Any]:
    """The command line of a worker child: ``URL`` (``-``: ``$CONSENSUS_URL``), then a command.
    Returns the parser, the options every command takes (``child_options``; pass it as ``parents``)
    and the commands (``add_parser``)."""
    common = child_options(argparse.ArgumentParser(add_help=False))
    parser = argparse.ArgumentParser(prog=f"python -m {module}")
    parser.add_argument("url")
    commands = parser.add_subparsers(dest="command", required=True)
    return parser, common, commands


def child_start(args: argparse.Namespace, grace: float = 0.0) -> dict[str, str]:
    """Arm the watchdog (the process exits with ``WATCHDOG_EXIT`` ``grace`` seconds after its
    ``--lifetime``, whatever happens) and return the session options of ``--opt``."""
    watchdog = threading.Timer(args.lifetime + grace, lambda: os._exit(WATCHDOG_EXIT))
    watchdog.daemon = True
    watchdog.start()
    return dict(item.partition("=")[::2] for item in args.opt)


class ChildProcess(Closing):
    """A child Python process: its report lines, commands, signals and teardown."""

    def __init__(
        self,
        module: str,
        args: Sequence[str],
        url: str,
        options: Mapping[str, object],
        lifetime: float = 120.0,
        *,
        name: str,
        launcher: Sequence[str] = (),
    ) -> None:
        """Start the child; ``launcher`` prefixes its command line (e.g. ``NetworkNamespace.prefix``)."""
        argv = [*launcher, sys.executable, "-m", module, *args, "--lifetime", str(lifetime)]
        for option, value in options.items():
            argv += ["--opt", f"{option}={value}"]
        self.name = name
        self.lines: EventLog[str] = EventLog(name)
        #: When each line arrived (``time.monotonic()``), by index in ``lines``.
        self.arrivals: list[float] = []
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            bufsize=1,
            env={**os.environ, "CONSENSUS_URL": url},
        )
        self._reader = threading.Thread(target=self._read, name=f"{name} reader", daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        """The child's process id."""
        return self.proc.pid

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.arrivals.append(time.monotonic())
            self.lines(line.rstrip("\n"))
        self.arrivals.append(time.monotonic())
        self.lines(EOF_LINE)

    def stderr_tail(self, limit: int = 3000) -> str:
        """The end of what the child wrote to stderr."""
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace")[-limit:]

    def expect(self, prefix: str, timeout: float = EVENT_TIMEOUT, *, since: int = 0) -> tuple[int, str]:
        """The index and text of the first line at ``since`` or later that starts with ``prefix``."""
        try:
            index = self.lines.wait_index(
                lambda line: line.startswith(prefix) or line == EOF_LINE,
                timeout,
                since=since,
                what=f"a line starting with {prefix!r}",
            )
        except AssertionError as exc:
            raise AssertionError(f"{exc}\nchild stderr:\n{self.stderr_tail()}") from None
        line = self.lines.events[index]
        if line == EOF_LINE:
            self.proc.wait(5)
            raise AssertionError(
                f"{self.name} exited ({self.proc.returncode}) before printing {prefix!r}; "
                f"lines: {self.lines.events}\nchild stderr:\n{self.stderr_tail()}"
            )
        return index, line

    def send(self, line: str) -> None:
        """Write one command line to the child."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def signal(self, signum: signal.Signals) -> None:
        """Send ``signum`` (SIGSTOP, SIGCONT, SIGKILL, ...) to the child, by pid."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signum)

    def close(self) -> None:
        """Kill the child if it still runs, and reap it."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGKILL)
        try:
            self.proc.wait(10)
            self._reader.join(5)
        finally:
            for stream in (self.proc.stdin, self.proc.stdout):
                if stream is not None:
                    with contextlib.suppress(OSError):
                        stream.close()
            self._stderr.close()
