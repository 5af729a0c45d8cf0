"""``consensus elect SERVICE ID [-- CMD]`` as separate processes, on a SQLite file and a real etcd server
that is restarted and killed under it (no mocks)."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_support import read_line, run, spawn, wait_for

from consensus_testkit import ServerHandle, start_server

SESSION_TIMEOUT = 2.0
#: What noticing a loss may take beyond session_timeout on a loaded machine.
SLACK = 6.0
#: The exit status of ``consensus elect`` when the leadership was lost while CMD ran.
EXIT_LOST = 3


class Output:
    """The lines a process writes to stdout, collected by a thread as they come."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        assert process.stdout is not None
        stdout = process.stdout
        self._thread = threading.Thread(target=lambda: self.lines.extend(stdout), daemon=True)
        self._thread.start()

    def wait_for_line(self, text: str, timeout: float = 30) -> None:
        wait_for(lambda: any(text in line for line in self.lines), timeout, f"a line with {text!r}")


def leader_script(tmp_path: Path, name: str, then: str = "while :; do sleep 0.1; done") -> str:
    """A CMD that writes its term to NAME.term, then runs ``then``; on SIGTERM its trap writes
    NAME.stopped and it exits 143."""
    return (
        f"trap 'echo stopped > {tmp_path}/{name}.stopped; exit 143' TERM; "
        f"echo $CONSENSUS_TERM $CONSENSUS_SERVICE $CONSENSUS_LEADER_ID > {tmp_path}/{name}.term; {then}"
    )


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[str]]]:
    """The processes a test spawns; any left running are SIGKILLed at its end (their CMDs get SIGTERM)."""
    spawned: list[subprocess.Popen[str]] = []
    yield spawned
    for process in spawned:
        if process.poll() is None:
            process.kill()
        process.wait(30)


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'elect.db'}"


@pytest.fixture(scope="module")
def etcd() -> Iterator[ServerHandle]:
    with start_server("etcd") as handle:
        yield handle


def test_without_cmd_prints_leadership_changes(url: str, processes: list[subprocess.Popen[str]]) -> None:
    first = spawn("--url", url, "elect", "svc", "a")
    processes.append(first)
    first_output = Output(first)
    first_output.wait_for_line("svc leader=a term=")
    assert first_output.lines[0].endswith(" (leading)\n"), first_output.lines

    second = spawn("elect", "svc", "b", "--json", "--url", url)
    processes.append(second)
    second_output = Output(second)
    second_output.wait_for_line('"leader": "a"')
    first.send_signal(signal.SIGTERM)  # resigns, exit 0
    assert first.wait(30) == 0
    second_output.wait_for_line('"leader": "b"')
    second.send_signal(signal.SIGINT)
    assert second.wait(30) == 0
    events = [json.loads(line) for line in second_output.lines]
    assert [(e["leader"], e["leading"]) for e in events] == [("a", False), ("b", True)], events
    assert events[1]["term"] > events[0]["term"]
    assert set(events[0]) == {"type", "service", "leader", "term", "leading"}


def test_cmd_runs_only_while_leading(
    url: str, tmp_path: Path, processes: list[subprocess.Popen[str]]
) -> None:
    release = tmp_path / "release"
    first = spawn(
        "--url",
        url,
        "elect",
        "svc",
        "a",
        "--",
        "sh",
        "-c",
        leader_script(tmp_path, "a", f"while [ ! -e {release} ]; do sleep 0.1; done; exit 5"),
    )
    processes.append(first)
    term, service, leader = read_line(tmp_path / "a.term", 30).split()
    assert (service, leader) == ("svc", "a")
    second = spawn("--url", url, "elect", "svc", "b", "--", "sh", "-c", leader_script(tmp_path, "b", "true"))
    processes.append(second)
    late = run("elect", "svc", "c", "--timeout", "0.5", "--url", url, "--", "touch", str(tmp_path / "c.ran"))
    assert late.exit_code == 1 and "not elected within 0.5 s" in late.stderr
    now = run("leader", "svc", "--json", "--url", url)
    assert json.loads(now.stdout) == {"service": "svc", "leader": "a", "term": int(term)}
    assert not (tmp_path / "b.term").exists() and not (tmp_path / "c.ran").exists()
    release.touch()
    assert first.wait(30) == 5  # CMD's status passes through; leaving resigns
    assert second.wait(30) == 0
    assert int(read_line(tmp_path / "b.term", 5).split()[0]) > int(term)


def test_sigkilled_leader_hands_over_within_the_session_timeout(
    url: str, tmp_path: Path, processes: list[subprocess.Popen[str]]
) -> None:
    """The leading process dies: its CMD gets SIGTERM at once (parent-death signal), and the next
    candidate leads, with a greater term, once the session expired."""
    faulty = f"{url}?session_timeout={SESSION_TIMEOUT:g}&request_timeout=2"
    leader = spawn("--url", faulty, "elect", "svc", "a", "--", "sh", "-c", leader_script(tmp_path, "a"))
    processes.append(leader)
    term = int(read_line(tmp_path / "a.term", 30).split()[0])
    follower = spawn(
        "--url", faulty, "elect", "svc", "b", "--", "sh", "-c", leader_script(tmp_path, "b", "true")
    )
    processes.append(follower)
    time.sleep(0.5)  # the follower is in line
    leader.send_signal(signal.SIGKILL)
    wait_for((tmp_path / "a.stopped").exists, 5, "the dead leader's CMD stopped")
    took = wait_for((tmp_path / "b.term").exists, SESSION_TIMEOUT + SLACK, "the next candidate leading")
    assert took <= SESSION_TIMEOUT + SLACK
    assert follower.wait(30) == 0
    assert int(read_line(tmp_path / "b.term", 5).split()[0]) > term


def test_leader_paused_past_its_session_has_its_cmd_stopped(
    etcd: ServerHandle, tmp_path: Path, processes: list[subprocess.Popen[str]]
) -> None:
    """SIGSTOP the leading process past session_timeout: the next candidate leads with a greater term;
    once the first runs again it sees the loss, stops its CMD (SIGTERM: the trap runs) and exits 3."""
    faulty = f"{etcd.url}/elect-{tmp_path.name}?session_timeout={SESSION_TIMEOUT:g}&request_timeout=2"
    leader = spawn("--url", faulty, "elect", "svc", "a", "--", "sh", "-c", leader_script(tmp_path, "a"))
    processes.append(leader)
    term = int(read_line(tmp_path / "a.term", 30).split()[0])
    leader.send_signal(signal.SIGSTOP)
    try:
        follower = spawn(
            "--url", faulty, "elect", "svc", "b", "--", "sh", "-c", leader_script(tmp_path, "b", "true")
        )
        processes.append(follower)
        assert follower.wait(SESSION_TIMEOUT + SLACK + 10) == 0, follower.communicate()[1]
        assert not (tmp_path / "a.stopped").exists()  # nobody could tell the paused leader's CMD
    finally:
        leader.send_signal(signal.SIGCONT)
    assert leader.wait(SESSION_TIMEOUT + SLACK) == EXIT_LOST
    assert (tmp_path / "a.stopped").read_text() == "stopped\n"
    assert int(read_line(tmp_path / "b.term", 5).split()[0]) > term


def test_cmd_goes_on_through_a_server_restart(
    etcd: ServerHandle, tmp_path: Path, processes: list[subprocess.Popen[str]]
) -> None:
    """The server is down for 3 s and restarted, well within session_timeout: the session survives, so
    the leadership and CMD go on at the same term; a SIGTERM to elect reaches CMD, whose status passes
    through."""
    url = f"{etcd.url}/elect-{tmp_path.name}?session_timeout=20"
    elect = spawn("--url", url, "elect", "svc", "a", "--", "sh", "-c", leader_script(tmp_path, "a"))
    processes.append(elect)
    term = int(read_line(tmp_path / "a.term", 30).split()[0])
    etcd.kill()
    time.sleep(3)
    etcd.restart()
    wait_for(lambda: run("leader", "svc", "--url", url).exit_code == 0, 30, "etcd answering again")
    after = run("leader", "svc", "--json", "--url", url)
    assert json.loads(after.stdout)["term"] == term
    assert elect.poll() is None and not (tmp_path / "a.stopped").exists()
    elect.send_signal(signal.SIGTERM)
    assert elect.wait(30) == 143  # CMD's trap: exit 143
    assert (tmp_path / "a.stopped").exists()


def test_cmd_stops_when_the_server_is_gone_past_the_session(
    etcd: ServerHandle, tmp_path: Path, processes: list[subprocess.Popen[str]]
) -> None:
    """The server is killed: once session_timeout passed without it, the session is lost, so is the
    leadership: CMD gets SIGTERM and elect exits 3, while the server is still down."""
    url = f"{etcd.url}/elect-{tmp_path.name}?session_timeout={SESSION_TIMEOUT:g}&request_timeout=2"
    elect = spawn("--url", url, "elect", "svc", "a", "--", "sh", "-c", leader_script(tmp_path, "a"))
    processes.append(elect)
    read_line(tmp_path / "a.term", 30)
    etcd.kill()
    try:
        assert elect.wait(SESSION_TIMEOUT + SLACK) == EXIT_LOST
        assert (tmp_path / "a.stopped").read_text() == "stopped\n"
        assert "lost the leadership of 'svc'" in elect.communicate()[1]
    finally:
        etcd.restart()
