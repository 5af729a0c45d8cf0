"""The examples in examples/ run their demos to the end on SQLite and report success."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _run(script: str, tmp_path: Path, *args: str) -> str:
    url = f"sqlite:///{tmp_path / 'demo.db'}"
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / script), url, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"{script} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.mark.parametrize("mode", ["cooperative", "incremental"])
def test_task_workers_never_run_a_task_twice(tmp_path: Path, mode: str) -> None:
    """Kafka Connect style workers: a 4th joins, the busiest is killed; no task ran twice at once."""
    output = _run("task_workers.py", tmp_path, "--mode", mode)
    assert "no task ever ran on two workers at once" in output
    assert "was killed; its tasks moved on" in output


def test_leader_service_fails_over(tmp_path: Path) -> None:
    """Schema Registry style single writer: the writer is killed, another node takes over the log."""
    output = _run("leader_service.py", tmp_path)
    assert "written by" in output and " then " in output
