"""The command ``consensus lock`` and ``consensus elect`` run (CMD), and how it is stopped.

Guarantees:

* CMD runs in a process group of its own; stopping it signals the whole group,
  so what a shell script started stops too: SIGTERM, then SIGKILL to whatever
  is left once CMD exited or the grace period passed.
* SIGTERM, SIGINT and SIGHUP sent to this process while CMD runs go to CMD's
  group; this process goes on waiting for CMD and exits with its status.
* When stdin is a terminal whose foreground job this process is, CMD's group
  becomes the foreground job while it runs (it may read the terminal; Ctrl-C
  reaches it), and the terminal is taken back after it.
* On Linux, CMD gets SIGTERM if this process dies while CMD runs, even by
  SIGKILL (the parent-death signal, ``_orphan_guard.py``).
* CMD's status is reported as a shell reports it: its exit status, 128+N when
  signal N ended it, 126 when it cannot be run, 127 when it is not found.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import FrameType

import click

from consensus_api.cli._common import F, print_error

#: The exit status when the lock or the leadership was lost (and CMD, if it ran, was stopped).
EXIT_LOST = 3
EXIT_CANNOT_RUN = 126
EXIT_NOT_FOUND = 127
#: The signals passed on to CMD, and that end a wait for a lock or for leadership.
HANDLED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
#: How often the wait for CMD looks whether it exited (a loss is seen at once).
CHILD_POLL = 0.05
#: How long CMD's exit is awaited after SIGKILL (a process stuck in the kernel may outlive it).
KILL_WAIT = 5.0
#: Seconds between SIGTERM and SIGKILL when CMD is stopped, unless --grace says otherwise.
DEFAULT_GRACE = 5.0
_ORPHAN_GUARD = Path(__file__).with_name("_orphan_guard.py")

SignalHandler = Callable[[int, FrameType | None], None]


def grace_option(func: F) -> F:
    """``--grace S``: the seconds between SIGTERM and SIGKILL when CMD is stopped."""
    return click.option(
        "--grace",
        type=click.FloatRange(min=0),
        default=DEFAULT_GRACE,
        show_default=True,
        metavar="S",
        help="Seconds between SIGTERM and SIGKILL when CMD is stopped.",
    )(func)


@contextlib.contextmanager
def on_signals(handler: SignalHandler) -> Iterator[None]:
    """``handler`` handles SIGTERM, SIGINT and SIGHUP meanwhile; the previous handlers come back after."""
    previous = {signum: signal.signal(signum, handler) for signum in HANDLED_SIGNALS}
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


def exit_by_signal(signum: int, _frame: FrameType | None) -> None:
    """A signal ends the command with status 128+N, unwinding (the session closes on the way out)."""
    raise SystemExit(128 + signum)


def run_command(
    argv: Sequence[str],
    env: Mapping[str, str],
    lost: threading.Event,
    grace: float,
    why_lost: str,
) -> int:
    """Run CMD ``argv`` with ``env`` until it exits (its status) or ``lost`` is set: then CMD is
    stopped, ``why_lost`` printed, and the status is ``EXIT_LOST`` (also when ``lost`` was set
    before CMD could start, which it then does not)."""
    if lost.is_set():
        print_error(why_lost)
        return EXIT_LOST
    try:
        process = subprocess.Popen(_guarded(argv), env=dict(env), process_group=0)
    except FileNotFoundError:
        print_error(f"{argv[0]}: command not found")
        return EXIT_NOT_FOUND
    except OSError as exc:
        print_error(f"{argv[0]}: {exc.strerror or exc}")
        return EXIT_CANNOT_RUN

    def forward(signum: int, _frame: FrameType | None) -> None:
        _signal_group(process.pid, signum)

    with on_signals(forward), _foreground(process.pid):
        while process.poll() is None and not lost.wait(CHILD_POLL):
            pass
        if not lost.is_set():
            assert process.returncode is not None
            return _shell_status(process.returncode)
        print_error(why_lost)
        _stop(process, grace)
        return EXIT_LOST


def _guarded(argv: Sequence[str]) -> list[str]:
    """``argv`` behind the orphan guard on Linux (the guard execs it: same pid, nothing else changes)."""
    if not sys.platform.startswith("linux"):
        return list(argv)
    return [sys.executable, "-I", "-S", str(_ORPHAN_GUARD), str(os.getpid()), *argv]


def _stop(process: subprocess.Popen[bytes], grace: float) -> None:
    """SIGTERM to CMD's group; SIGKILL to what is left of it once CMD exited or after ``grace``."""
    _signal_group(process.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(grace)
    _signal_group(process.pid, signal.SIGKILL)
    try:
        process.wait(KILL_WAIT)
    except subprocess.TimeoutExpired:
        print_error(f"CMD (process {process.pid}) is still there {KILL_WAIT:g} s after SIGKILL")


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def _shell_status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


@contextlib.contextmanager
def _foreground(pgid: int) -> Iterator[None]:
    """Make group ``pgid`` the terminal's foreground job meanwhile, if this process's group is."""
    try:
        terminal = sys.stdin.fileno()
        ours = os.isatty(terminal) and os.tcgetpgrp(terminal) == os.getpgrp()
    except (OSError, ValueError):
        ours = False
    if not ours:
        yield
        return
    with contextlib.suppress(OSError):
        os.tcsetpgrp(terminal, pgid)
    try:
        yield
    finally:
        # A background group that sets the foreground job gets SIGTTOU unless it ignores it.
        previous = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
        try:
            with contextlib.suppress(OSError):
                os.tcsetpgrp(terminal, os.getpgrp())
        finally:
            signal.signal(signal.SIGTTOU, previous)
