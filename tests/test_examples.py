"""The examples in examples/ run their demos to the end on SQLite and report success."""

from __future__ import annotations

import re
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
    """Schema Registry style single writer: the node killed is the writer, another node takes the writer
    lock with a greater token and goes on appending; the log's tokens never go back."""
    output = _run("leader_service.py", tmp_path)
    killed = re.search(r"demo: killing the writer (n\d) \(SIGKILL\), which holds token (\d+)$", output, re.M)
    assert killed, output
    handover = re.search(
        r"demo: fenced hand-over: (n\d) \(token (\d+)\) -> (n\d) \(token (\d+)\)$", output, re.M
    )
    assert handover, output
    assert handover[1] == killed[1] and handover[2] == killed[2]
    assert handover[3] != handover[1] and int(handover[4]) > int(handover[2])
    before_kill = output[: killed.start()].splitlines()
    last_append = [line for line in before_kill if "appended entry" in line][-1]
    assert f"] {killed[1]}: appended entry" in last_append, output  # it was the current writer
    tenures = re.search(r"demo: the log holds \d+ entries, written by (.+)$", output, re.M)
    assert (
        tenures and f"{killed[1]} (token {killed[2]}) then {handover[3]} (token {handover[4]})" in tenures[1]
    )
