"""Child Python processes that talk to their parent in lines: the parent's handle and the child's side.

The parent starts ``python -P -m MODULE ARGS... --lifetime S`` (:class:`Child`): the child imports
what this interpreter has installed, never a module that happens to lie in the working directory.
A URL never goes on the command line, which ``ps`` shows: it is passed in ``$CONSENSUS_URL``. The
parent writes commands to the child's stdin and the child reports on stdout, one line each; the
parent keeps every line with its arrival time (``time.monotonic()``, system-wide on Linux) and
waits for one only as long as it is told. It signals the child by PID, and only while the child is
not yet reaped (a reaped PID may name another process by now); ``close`` reaps it, also when the
caller failed (``with``), and releases everything it held. Each child runs in a session of its
own: a Ctrl-C at the terminal reaches only the parent, which then ends its children.

The child reads its commands through :class:`Parent` and reports with :func:`say`. A watchdog ends
the child (exit status ``WATCHDOG_EXIT``) ``grace`` seconds after its lifetime is over, or after
stdin closed (the parent closed it, or is gone), whatever the child is doing then: no child
outlives its parent, or its lifetime, by more than ``grace``.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from pathlib import Path
from typing import IO

from consensus_api.closing import Closing
from consensus_api.config import ENV_URL

#: The exit status of a child its watchdog ended.
WATCHDOG_EXIT = 3
#: How long ``close`` waits for a SIGKILLed child to be reaped, and for its output to be read.
REAP_TIMEOUT = 10.0

_say_lock = threading.Lock()


class Child(Closing):
    """The parent's handle on one child process: its report lines, its commands, signals and teardown."""

    def __init__(
        self,
        module: str,
        args: Sequence[str] = (),
        *,
        lifetime: float,
        url: str | None = None,
        name: str | None = None,
        launcher: Sequence[str] = (),
        log: Path | None = None,
        on_line: Callable[[str], None] | None = None,
    ) -> None:
        """Start ``python -P -m module *args --lifetime lifetime``, with ``url`` in ``$CONSENSUS_URL``.

        ``launcher`` prefixes the command line (e.g. a network namespace's ``ip netns exec``). The
        child's stderr goes to ``log`` (created or truncated), else to a temporary file; either way
        ``stderr_tail`` reads it. ``on_line`` is called with each report line, in order, on the
        reader thread, after its arrival time is kept and before ``wait_line`` can see the line.
        """
        self.name = name or module
        self._on_line = on_line
        self._changed = threading.Condition()
        self._lines: list[str] = []
        self._arrivals: list[float] = []
        self._ended = False
        self._stderr: IO[bytes] = log.open("w+b") if log is not None else tempfile.TemporaryFile()  # noqa: SIM115
        env = {**os.environ, ENV_URL: url} if url is not None else dict(os.environ)
        try:
            self.process = subprocess.Popen(
                [*launcher, sys.executable, "-P", "-m", module, *args, "--lifetime", str(lifetime)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._stderr,
                text=True,
                bufsize=1,
                env=env,
                start_new_session=True,
            )
        except BaseException:
            self._stderr.close()
            raise
        self._reader = threading.Thread(target=self._read, name=f"{self.name} reader", daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        """The child's process id."""
        return self.process.pid

    @property
    def returncode(self) -> int | None:
        """The child's exit status once it exited (negative: the signal that ended it), else None."""
        return self.process.poll()

    @property
    def ended(self) -> bool:
        """Whether the child's output ended (it exited, or closed its stdout)."""
        with self._changed:
            return self._ended

    @property
    def arrivals(self) -> list[float]:
        """When each report line arrived (``time.monotonic()``), by index."""
        with self._changed:
            return list(self._arrivals)

    def _read(self) -> None:
        assert self.process.stdout is not None
        for raw in self.process.stdout:
            line = raw.rstrip("\n")
            with self._changed:
                self._arrivals.append(time.monotonic())
            if self._on_line is not None:
                self._on_line(line)
            with self._changed:
                self._lines.append(line)
                self._changed.notify_all()
        with self._changed:
            self._ended = True
            self._changed.notify_all()

    def lines_from(self, since: int = 0) -> list[str]:
        """The report lines so far, from index ``since`` on."""
        with self._changed:
            return self._lines[since:]

    def wait_line(
        self, predicate: Callable[[str], bool], timeout: float, *, since: int = 0
    ) -> tuple[int, str] | None:
        """The index and text of the first report line at ``since`` or later that satisfies
        ``predicate``; None if none did within ``timeout`` seconds or before the child's output ended."""
        deadline = time.monotonic() + timeout
        checked = since
        with self._changed:
            while True:
                for index in range(checked, len(self._lines)):
                    if predicate(self._lines[index]):
                        return index, self._lines[index]
                checked = max(checked, len(self._lines))
                remaining = deadline - time.monotonic()
                if self._ended or remaining <= 0:
                    return None
                self._changed.wait(remaining)

    def send(self, line: str) -> bool:
        """Write one command line; False if the child no longer reads its stdin."""
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(line + "\n")
            self.process.stdin.flush()
        except (OSError, ValueError):  # a broken pipe, or stdin closed by ``close``
            return False
        return True

    def signal(self, signum: int) -> bool:
        """Send ``signum`` by PID unless the child was reaped; whether it was sent."""
        if self.process.poll() is not None:
            return False
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.process.pid, signum)
        return True

    def pause(self) -> bool:
        """SIGSTOP the child; whether it was sent."""
        return self.signal(signal.SIGSTOP)

    def resume(self) -> bool:
        """SIGCONT the child; whether it was sent."""
        return self.signal(signal.SIGCONT)

    def kill(self) -> float:
        """SIGKILL the child (also a paused one), not waiting for it; ``time.monotonic()`` just
        before the signal."""
        at = time.monotonic()
        self.signal(signal.SIGKILL)
        return at

    def stderr_tail(self, limit: int = 3000) -> str:
        """The last ``limit`` characters the child wrote to stderr ("" once closed)."""
        with contextlib.suppress(OSError, ValueError):
            size = self._stderr.seek(0, os.SEEK_END)
            self._stderr.seek(max(0, size - 4 * limit))
            return self._stderr.read().decode(errors="replace")[-limit:]
        return ""

    def close(self, grace: float = 0.0) -> None:
        """End the child and reap it: stdin closed, ``grace`` seconds to exit on its own, then SIGKILL.
        Idempotent."""
        close_all([self], grace)

    def _release(self) -> None:
        """Reap the SIGKILLed child (bounded), read the rest of its output, close every stream."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(REAP_TIMEOUT)
        self._reader.join(REAP_TIMEOUT)
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        self._stderr.close()


def close_all(children: Iterable[Child], grace: float = 0.0) -> None:
    """End every child and reap it: all stdins closed at once, ``grace`` seconds in all for them to
    exit on their own, then SIGKILL for any still running."""
    ending = list(children)
    if grace > 0:
        for child in ending:
            if child.process.stdin is not None:
                with contextlib.suppress(OSError):
                    child.process.stdin.close()
        deadline = time.monotonic() + grace
        for child in ending:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.process.wait(max(0.0, deadline - time.monotonic()))
    for child in ending:
        child.kill()
    for child in ending:
        child._release()


def say(*parts: object) -> None:
    """The child's side: one report line to the parent (the parts joined by spaces, newlines
    replaced), written whole and flushed; safe from any thread."""
    line = " ".join(str(part) for part in parts).replace("\n", " ")
    with _say_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


class Parent:
    """The child's side: the parent's commands on stdin, read by a daemon thread, and the watchdog.

    Created once, first thing in the child, with the ``--lifetime`` the parent passed. ``stop`` is
    set once stdin closes or a line in ``stop_words`` arrives (the line is still delivered).
    """

    def __init__(self, lifetime: float, *, grace: float = 5.0, stop_words: Collection[str] = ()) -> None:
        self.deadline = time.monotonic() + lifetime
        self.stop = threading.Event()
        self._grace = grace
        self._stop_words = frozenset(stop_words)
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._end_after(lifetime + grace)
        threading.Thread(target=self._read, name="parent commands", daemon=True).start()

    def _end_after(self, seconds: float) -> None:
        watchdog = threading.Timer(seconds, os._exit, (WATCHDOG_EXIT,))
        watchdog.daemon = True
        watchdog.start()

    def _read(self) -> None:
        for raw in sys.stdin:
            if line := raw.strip():
                if line in self._stop_words:
                    self.stop.set()
                self._lines.put(line)
        self.stop.set()
        self._lines.put(None)
        self._end_after(self._grace)

    def next(self) -> str | None:
        """The next command line (stripped, never blank); None once stdin closed or the lifetime is
        over."""
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            return None
        try:
            line = self._lines.get(timeout=remaining)
        except queue.Empty:
            return None
        if line is None:
            self._lines.put(None)  # every later call sees the end as well
        return line

    def wait_for(self, word: str, *, abort_on: Collection[str] = ()) -> bool:
        """Skip command lines until ``word``: True once it arrives; False once stdin closed, the
        lifetime is over or a line in ``abort_on`` arrived first."""
        while (line := self.next()) is not None:
            if line == word:
                return True
            if line in abort_on:
                return False
        return False
