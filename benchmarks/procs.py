"""The parent's handle on a ``python -m benchmarks.child`` process: the runtime's child harness
(:mod:`consensus_api.children`) with the benchmarks' reading of lines: each ``expect`` takes the next
line starting with its word, and an ``ERROR`` line fails it."""

from __future__ import annotations

from benchmarks.core import EVENT_TIMEOUT
from consensus_api.children import Child as _HarnessChild


class ChildError(RuntimeError):
    """A child process failed, answered unexpectedly or not in time."""


class Child(_HarnessChild):
    """One ``benchmarks.child`` process running ``MODE ARGS...``; a URL argument (one with ``://``)
    reaches it through ``$CONSENSUS_URL`` (its place on the command line says ``-``)."""

    def __init__(self, *args: str, lifetime: float = 900.0) -> None:
        urls = [arg for arg in args if "://" in arg]
        if len(urls) > 1:
            raise ValueError(f"a benchmark child takes one URL, not {len(urls)}")
        self.args = args
        self._next = 0
        argv = ["-" if "://" in arg else arg for arg in args]
        url = urls[0] if urls else None
        super().__init__("benchmarks.child", argv, lifetime=lifetime, url=url, name=f"{args[0]} child")

    def expect(self, word: str, timeout: float = EVENT_TIMEOUT * 3) -> list[str]:
        """The fields after ``word`` of the next line starting with it; ``ChildError`` on an ``ERROR``
        line, an exit or ``timeout``."""
        found = self.wait_line(
            lambda line: line.split()[:1] in ([word], ["ERROR"]), timeout, since=self._next
        )
        if found is None:
            if self.ended:
                tail = " | ".join(self.stderr_tail().splitlines()[-5:])
                raise ChildError(f"{self.args[0]} child exited: {tail}")
            raise ChildError(f"{self.args[0]} child: no {word} within {timeout:g} s")
        index, line = found
        self._next = index + 1
        fields = line.split()
        if fields[0] == "ERROR":
            raise ChildError(f"{self.args[0]} child: {line}")
        return fields[1:]

    def close(self, grace: float = 10.0) -> None:
        """Close stdin (the child exits), wait ``grace`` seconds at most, then SIGKILL; reap."""
        super().close(grace)
