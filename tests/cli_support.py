"""Helpers of the ``consensus`` command's tests (``test_cli*.py``)."""

from __future__ import annotations

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
