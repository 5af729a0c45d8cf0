"""Helpers of the ``consensus`` command's tests (``test_cli*.py``)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from click.testing import CliRunner, Result

from consensus_api.cli import cli


def run(*args: str, input: bytes | None = None) -> Result:
    """``consensus ARGS`` in this process (click's runner), stdout and stderr apart."""
    return CliRunner().invoke(cli, list(args), input=input)


def assert_clean_error(result: Result, code: int, message: str) -> None:
    """Exit status ``code``, ``message`` on stderr, and no traceback."""
    assert result.exit_code == code, result.output
    assert message in result.stderr
    assert "Traceback" not in result.output


#: ``consensus`` as a process of its own.
CLI = [sys.executable, "-m", "consensus_api.cli"]


def spawn(*args: str) -> subprocess.Popen[str]:
    """``consensus ARGS`` as a process of its own, stdout and stderr piped (text)."""
    return subprocess.Popen([*CLI, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> float:
    """Poll ``condition`` until true; the seconds it took, or ``AssertionError`` after ``timeout``."""
    began = time.monotonic()
    while not condition():
        if time.monotonic() - began > timeout:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(0.02)
    return time.monotonic() - began


def read_line(path: Path, timeout: float) -> str:
    """The first line written to ``path``, once it is whole (waits at most ``timeout``)."""
    wait_for(lambda: path.is_file() and path.read_text().endswith("\n"), timeout, f"a line in {path}")
    return path.read_text().splitlines()[0]
