"""Processes by PID, safely: a PID is used only while it still names the process it was taken from.

On a busy machine the kernel hands out every PID again within minutes
(threads included), so every helper here checks the process's identity
(psutil compares PID and creation time) before it signals or waits.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from typing import Any

import psutil
from mirakuru import SimpleExecutor


def process_at(pid: object, started: object = None) -> psutil.Process | None:
    """The process ``pid`` names now, or None if there is none; given ``started`` (a creation time, as
    a control file records it), None too if the PID now names a later process."""
    if not isinstance(pid, int):
        return None
    try:
        process = psutil.Process(pid)
        if started is not None and process.create_time() != started:
            return None
    except psutil.NoSuchProcess:
        return None
    return process


def family_of(root: psutil.Process) -> list[psutil.Process]:
    """``root`` and all its descendants (none if ``root`` is gone or its PID names another process)."""
    try:
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def alive(process: psutil.Process) -> bool:
    """True while ``process`` runs and is not a zombie (False once its PID names another process)."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def signal_all(processes: Sequence[psutil.Process], sig: int) -> None:
    """Send ``sig`` to each of ``processes`` still running as the process it was taken from."""
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.send_signal(sig)  # psutil refuses a PID that names another process by now


def wait_gone(processes: Sequence[psutil.Process], timeout: float) -> None:
    """Wait until every one of ``processes`` is gone; RuntimeError naming those left after ``timeout``."""
    deadline = time.monotonic() + timeout
    while any(alive(process) for process in processes):
        if time.monotonic() > deadline:
            left = [process.pid for process in processes if alive(process)]
            raise RuntimeError(f"processes {left} survived SIGKILL for {timeout}s")
        time.sleep(0.01)


def wait_reaped(process: psutil.Process, timeout: float) -> None:
    """Wait (at most ``timeout``) until ``process`` is gone, zombie included."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.is_running():
        time.sleep(0.01)


class SessionExecutor(SimpleExecutor):
    """A mirakuru executor that starts its process in a new session without ``preexec_fn``.

    mirakuru's ``preexec_fn=os.setsid`` runs Python code between fork and exec,
    which gRPC's fork handlers sometimes abort when grpc threads are running in
    the test process; ``start_new_session`` does the same in C.
    """

    @property
    def _popen_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = super()._popen_kwargs
        kwargs.pop("preexec_fn", None)
        kwargs["start_new_session"] = True
        return kwargs
