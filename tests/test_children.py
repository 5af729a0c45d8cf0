"""The child-process harness (``consensus_api.children``): lines, bounds, signals, teardown, watchdog."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from consensus_api.children import WATCHDOG_EXIT, Child, close_all

URL = "sqlite:////nowhere/secret.db"


@pytest.fixture
def spawn(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Callable[..., Child]]:
    """``spawn(grace=5.0, lifetime=30.0)``: a ``children_child`` process, run from a directory whose
    ``json.py`` would break any import of ``json`` by the child; every one is closed at teardown."""
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent))
    (tmp_path / "json.py").write_text("raise ImportError('the working directory was searched')\n")
    monkeypatch.chdir(tmp_path)
    children: list[Child] = []

    def start(grace: float = 5.0, lifetime: float = 30.0) -> Child:
        child = Child(
            "children_child", ["--grace", str(grace)], lifetime=lifetime, url=URL, name="test child"
        )
        children.append(child)
        return child

    yield start
    close_all(children)


def ready(child: Child) -> None:
    assert child.wait_line(lambda line: line == "READY", 30) is not None, child.stderr_tail()


def test_the_url_reaches_the_child_through_its_environment_only(spawn: Callable[..., Child]) -> None:
    child = spawn()
    ready(child)
    assert URL not in Path(f"/proc/{child.pid}/cmdline").read_bytes().decode()
    assert child.send("URL")
    assert child.wait_line(lambda line: line.startswith("URL "), 10) == (1, f"URL {URL}")
    assert len(child.arrivals) == 2 and child.arrivals[0] <= child.arrivals[1] <= time.monotonic()


def test_a_wait_for_a_line_is_bounded(spawn: Callable[..., Child]) -> None:
    child = spawn()
    ready(child)
    began = time.monotonic()
    assert child.wait_line(lambda line: line == "NEVER", 0.3) is None
    assert 0.3 <= time.monotonic() - began < 2
    assert child.returncode is None and not child.ended


def test_a_paused_child_answers_once_resumed(spawn: Callable[..., Child]) -> None:
    child = spawn()
    ready(child)
    assert child.pause()
    child.send("PING")
    assert child.wait_line(lambda line: line == "PONG", 0.5) is None
    assert child.resume()
    assert child.wait_line(lambda line: line == "PONG", 10) is not None


def test_a_stop_word_or_the_end_of_stdin_stops_the_child(spawn: Callable[..., Child]) -> None:
    told, left = spawn(), spawn()
    for child in (told, left):
        ready(child)
    told.send("STOP")
    assert told.wait_line(lambda line: line == "BYE", 10) is not None
    close_all([left], grace=10)
    assert left.lines_from() == ["READY", "BYE"] and left.returncode == 0


def test_close_kills_and_reaps_and_then_nothing_reaches_the_pid(spawn: Callable[..., Child]) -> None:
    child = spawn()
    ready(child)
    child.close()
    assert child.returncode == -signal.SIGKILL and child.ended
    assert not child.signal(signal.SIGCONT) and not child.send("PING")
    child.close()  # idempotent


def test_the_watchdog_ends_a_child_stuck_past_its_lifetime(spawn: Callable[..., Child]) -> None:
    child = spawn(grace=0.5, lifetime=1.0)
    ready(child)
    child.send("SLEEP")
    child.process.wait(10)
    assert child.returncode == WATCHDOG_EXIT


def test_the_watchdog_ends_a_stuck_child_once_its_stdin_closed(spawn: Callable[..., Child]) -> None:
    child = spawn(grace=0.5, lifetime=60.0)
    ready(child)
    child.send("SLEEP")
    began = time.monotonic()
    close_all([child], grace=10)
    assert child.returncode == WATCHDOG_EXIT and time.monotonic() - began < 5
