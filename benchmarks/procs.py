"""The parent's handle on a ``python -m benchmarks.child`` process: line protocol, bounded waits, SIGKILL."""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from benchmarks.core import EVENT_TIMEOUT

ROOT = Path(__file__).resolve().parent.parent


#: Environment variables holding the URL arguments of a child (``env:NAME`` on its command line).
URL_ARG_PREFIX = "BENCHMARK_CHILD_ARG_"


class ChildError(RuntimeError):
    """A child process failed, answered unexpectedly or not in time."""


class Child:
    """One child process; its stdout lines arrive through a reader thread."""

    def __init__(self, *args: str, lifetime: float = 900.0) -> None:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }
        self.args = args
        # URLs (perhaps with a password) go through the environment: ps shows every command line.
        argv = list(args)
        for index, arg in enumerate(args):
            if "://" in arg:
                env[f"{URL_ARG_PREFIX}{index}"] = arg
                argv[index] = f"env:{URL_ARG_PREFIX}{index}"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.child", *argv, "--lifetime", str(lifetime)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
            bufsize=1,
        )
        self.pid = self.process.pid
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._errors: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._drain, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._lines.put(line.rstrip("\n"))
        self._lines.put(None)

    def _drain(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self._errors = [*self._errors[-30:], line.rstrip("\n")]

    def expect(self, word: str, timeout: float = EVENT_TIMEOUT * 3) -> list[str]:
        """The fields after ``word`` of the next line starting with it; ``ChildError`` on an ``ERROR``
        line, an exit or ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise ChildError(f"{self.args[0]} child: no {word} within {timeout:g} s") from None
            if line is None:
                raise ChildError(f"{self.args[0]} child exited: {' | '.join(self._errors[-5:])}")
            fields = line.split()
            if fields and fields[0] == "ERROR":
                raise ChildError(f"{self.args[0]} child: {line}")
            if fields and fields[0] == word:
                return fields[1:]

    def send(self, line: str) -> None:
        """Write one command line."""
        assert self.process.stdin is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()

    def kill(self) -> float:
        """SIGKILL the child; returns ``time.monotonic()`` just before the signal."""
        at = time.monotonic()
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        return at

    def close(self, timeout: float = 10.0) -> None:
        """Close stdin (the child exits), wait a bounded time, then SIGKILL."""
        with contextlib.suppress(OSError, ValueError):
            assert self.process.stdin is not None
            self.process.stdin.close()
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            self.process.wait(5)
