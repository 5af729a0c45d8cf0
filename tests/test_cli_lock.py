"""``consensus lock NAME -- CMD`` as separate processes, on a SQLite file and a real etcd server, under
real faults: the holder SIGKILLed, the holder paused past its session (no mocks)."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_support import CLI, read_line, spawn, wait_for

from consensus_testkit import ServerHandle, start_server

#: Short sessions keep the fault tests fast; requests are bounded alike.
SESSION_TIMEOUT = 2.0
FAULT_QUERY = f"session_timeout={SESSION_TIMEOUT:g}&request_timeout=2"
#: What a handover may take beyond session_timeout: the backend's detection delay, and a loaded machine.
SLACK = 6.0
#: The exit status of ``consensus lock`` when the lock was lost while CMD ran.
EXIT_LOST = 3


def holder_script(tmp_path: Path, name: str) -> str:
    """A CMD that writes its token to NAME.token, runs until stopped, and on SIGTERM writes
    NAME.stopped (its trap) and exits."""
    return (
        f"trap 'echo stopped > {tmp_path}/{name}.stopped; exit 143' TERM; "
        f"echo $CONSENSUS_LOCK_TOKEN > {tmp_path}/{name}.token; "
        "while :; do sleep 0.1; done"
    )


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[str]]]:
    """The processes a test spawns; any left running are SIGKILLed at its end (their CMDs get SIGTERM)."""
    spawned: list[subprocess.Popen[str]] = []
    yield spawned
    for process in spawned:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=30)


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'lock.db'}"


@pytest.fixture(scope="module")
def etcd() -> Iterator[ServerHandle]:
    with start_server("etcd") as handle:
        yield handle


def lock_cmd(url: str, name: str, script: str, *options: str) -> list[str]:
    return ["--url", url, "lock", name, *options, "--", "sh", "-c", script]


def test_cmd_gets_the_token_and_its_status_passes_through(url: str) -> None:
    def lock(script: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*CLI, *lock_cmd(url, "jobs/x", script)], capture_output=True, text=True, timeout=60, check=False
        )

    first = lock("echo $CONSENSUS_LOCK_TOKEN")
    assert first.returncode == 0, first.stderr
    second = lock('echo "$CONSENSUS_LOCK_TOKEN $CONSENSUS_LOCK_NAME $CONSENSUS_URL"; exit 7')
    assert second.returncode == 7, second.stderr
    token, name, child_url = second.stdout.split()
    assert int(token) > int(first.stdout) >= 0
    assert (name, child_url) == ("jobs/x", url)

    missing = subprocess.run(
        [*CLI, "--url", url, "lock", "jobs/x", "--", "no-such-command-anywhere"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert missing.returncode == 127 and "not found" in missing.stderr


def test_two_at_once_run_one_after_the_other(
    url: str, tmp_path: Path, processes: list[subprocess.Popen[str]]
) -> None:
    log = tmp_path / "log"
    script = (
        f'echo "start $CONSENSUS_LOCK_TOKEN" >> {log}; sleep 1; echo "end $CONSENSUS_LOCK_TOKEN" >> {log}'
    )
    processes += [spawn(*lock_cmd(url, "jobs/x", script)) for _ in range(2)]
    for process in processes:
        assert process.wait(60) == 0, process.communicate()[1]
    lines = [line.split() for line in log.read_text().splitlines()]
    assert [what for what, _ in lines] == ["start", "end", "start", "end"], lines
    tokens = [int(token) for _, token in lines]
    assert tokens[0] == tokens[1] < tokens[2] == tokens[3]


def test_timeout_exits_1_without_running_cmd(
    url: str, tmp_path: Path, processes: list[subprocess.Popen[str]]
) -> None:
    release = tmp_path / "release"
    holder = spawn(
        *lock_cmd(url, "jobs/x", f"echo held > {tmp_path}/held; while [ ! -e {release} ]; do sleep 0.1; done")
    )
    processes.append(holder)
    read_line(tmp_path / "held", 30)
    late = subprocess.run(
        [*CLI, *lock_cmd(url, "jobs/x", f"touch {tmp_path}/ran", "--timeout", "0.5")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert late.returncode == 1 and "not acquired within 0.5 s" in late.stderr
    assert not (tmp_path / "ran").exists()
    release.touch()
    assert holder.wait(30) == 0


def test_sigkilled_holder_passes_the_lock_on_within_the_session_timeout(
    url: str, tmp_path: Path, processes: list[subprocess.Popen[str]]
) -> None:
    """The holder process dies: its CMD gets SIGTERM at once (parent-death signal) and the lock passes
    on when its session expires."""
    faulty = f"{url}?{FAULT_QUERY}"
    holder = spawn(*lock_cmd(faulty, "jobs/k", holder_script(tmp_path, "holder")))
    processes.append(holder)
    first = int(read_line(tmp_path / "holder.token", 30))
    waiter = spawn(*lock_cmd(faulty, "jobs/k", f"echo $CONSENSUS_LOCK_TOKEN > {tmp_path}/waiter.token"))
    processes.append(waiter)
    time.sleep(0.5)  # the waiter is in line
    holder.send_signal(signal.SIGKILL)
    wait_for((tmp_path / "holder.stopped").exists, 5, "the dead holder's CMD stopped")
    took = wait_for((tmp_path / "waiter.token").exists, SESSION_TIMEOUT + SLACK, "the waiter took the lock")
    assert took <= SESSION_TIMEOUT + SLACK
    assert waiter.wait(30) == 0
    assert int(read_line(tmp_path / "waiter.token", 5)) > first


def test_holder_paused_past_its_session_has_its_cmd_stopped(
    etcd: ServerHandle, tmp_path: Path, processes: list[subprocess.Popen[str]]
) -> None:
    """SIGSTOP the holder past session_timeout: the next holder gets a greater token; once the first
    holder runs again it sees the loss, stops its CMD (SIGTERM: the trap runs) and exits 3."""
    faulty = f"{etcd.url}/lock-{tmp_path.name}?{FAULT_QUERY}"
    holder = spawn(*lock_cmd(faulty, "jobs/p", holder_script(tmp_path, "holder")))
    processes.append(holder)
    first = int(read_line(tmp_path / "holder.token", 30))
    holder.send_signal(signal.SIGSTOP)
    try:
        waiter = spawn(*lock_cmd(faulty, "jobs/p", f"echo $CONSENSUS_LOCK_TOKEN > {tmp_path}/waiter.token"))
        processes.append(waiter)
        assert waiter.wait(SESSION_TIMEOUT + SLACK + 10) == 0, waiter.communicate()[1]
        assert not (tmp_path / "holder.stopped").exists()  # nobody could tell the paused holder's CMD
    finally:
        holder.send_signal(signal.SIGCONT)
    assert holder.wait(SESSION_TIMEOUT + SLACK) == EXIT_LOST
    assert (tmp_path / "holder.stopped").read_text() == "stopped\n"
    assert "was lost" in holder.communicate()[1]
    assert int(read_line(tmp_path / "waiter.token", 5)) > first


def test_cmd_goes_on_through_a_server_restart(
    etcd: ServerHandle, tmp_path: Path, processes: list[subprocess.Popen[str]]
) -> None:
    """The server is down for 3 s and restarted, well within session_timeout: the lock is still held
    (another acquirer times out) and CMD goes on; a SIGTERM to lock reaches CMD, whose status passes
    through."""
    url = f"{etcd.url}/lock-{tmp_path.name}?session_timeout=20"
    holder = spawn(*lock_cmd(url, "jobs/r", holder_script(tmp_path, "holder")))
    processes.append(holder)
    read_line(tmp_path / "holder.token", 30)
    etcd.kill()
    time.sleep(3)
    etcd.restart()
    other = subprocess.run(
        [*CLI, *lock_cmd(url, "jobs/r", f"touch {tmp_path}/ran", "--timeout", "1")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert other.returncode == 1, other.stderr
    assert holder.poll() is None and not (tmp_path / "holder.stopped").exists()
    holder.send_signal(signal.SIGTERM)
    assert holder.wait(30) == 143  # CMD's trap: exit 143
    assert (tmp_path / "holder.stopped").exists() and not (tmp_path / "ran").exists()
