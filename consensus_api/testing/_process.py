"""Process, port and readiness helpers shared by the real test servers.

Every server runs as its own process group (mirakuru starts it with ``setsid``),
is signalled by PID only, and writes its output to ``<dir>/server.log``.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from mirakuru import SimpleExecutor
from mirakuru.exceptions import ProcessFinishedWithError

HOST = "127.0.0.1"
_issued_ports: set[int] = set()


def free_port() -> int:
    """Return a loopback port that was free a moment ago and never handed out before by this process."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((HOST, 0))
            port: int = sock.getsockname()[1]
        if port not in _issued_ports:
            _issued_ports.add(port)
            return port


def log_tail(path: Path, lines: int = 40) -> str:
    """Return the last ``lines`` lines of a log file, or a note that it is missing."""
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"<no log: {exc}>"
    return "\n".join(text.splitlines()[-lines:])


def run_checked(cmd: Sequence[str], log: Path, what: str, timeout: float = 120, **kwargs: Any) -> None:
    """Run a one-shot setup command, appending its output to ``log``; raise RuntimeError with the log tail on failure."""
    with log.open("ab") as out:
        try:
            proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                  timeout=timeout, check=False, **kwargs)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"{what} timed out after {timeout}s\n{log_tail(log)}") from None
    if proc.returncode != 0:
        raise RuntimeError(f"{what} failed with exit code {proc.returncode}\n{log_tail(log)}")


def tcp_request(port: int, payload: bytes, timeout: float = 1.0) -> bytes:
    """Send ``payload`` to HOST:port and return everything read until the peer closes (b"" on any error)."""
    try:
        with socket.create_connection((HOST, port), timeout=timeout) as sock:
            sock.sendall(payload)
            chunks = []
            while chunk := sock.recv(4096):
                chunks.append(chunk)
            return b"".join(chunks)
    except OSError:
        return b""


class ServerHandle:
    """One running real server: its client address, URL and a control handle.

    ``restart`` reuses the same command, port(s) and data dir. ``stop`` is
    graceful with a SIGKILL fallback, removes the server's dir and is
    idempotent; afterwards no process of the server's group is left.
    """

    def __init__(  # noqa: PLR0913 - every argument is part of the server description
        self,
        name: str,
        url: str,
        port: int,
        directory: Path,
        command: Sequence[str],
        probe: Callable[[], bool],
        *,
        stop_signal: int = signal.SIGTERM,
        stop_timeout: float = 30,
        popen_kwargs: dict[str, Any] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self.url = url
        self.host = HOST
        self.port = port
        self.directory = directory
        self.log_path = directory / "server.log"
        self._command = list(command)
        self._probe = probe
        self._stop_signal = stop_signal
        self._stop_timeout = stop_timeout
        self._popen_kwargs = popen_kwargs or {}
        self._env = env or {}
        self._executor: SimpleExecutor | None = None
        self._stopped = False

    def __repr__(self) -> str:
        return f"<ServerHandle {self.name} {self.url} pid={self._pid_or_none()}>"

    @property
    def pid(self) -> int:
        """PID of the server process (also its process group id)."""
        pid = self._pid_or_none()
        if pid is None:
            raise RuntimeError(f"{self.name} is not running")
        return pid

    def _pid_or_none(self) -> int | None:
        proc = self._executor.process if self._executor else None
        return proc.pid if proc is not None else None

    def running(self) -> bool:
        """True while the server process exists (paused counts as running)."""
        return self._executor is not None and self._executor.running()

    def spawn(self) -> None:
        """Start the server process without waiting for readiness."""
        if self._stopped:
            raise RuntimeError(f"{self.name} was stopped and its data removed; start a new server")
        if self.running():
            raise RuntimeError(f"{self.name} is already running")
        with self.log_path.open("ab") as log:
            self._executor = SimpleExecutor(
                self._command, cwd=str(self.directory), timeout=self._stop_timeout,
                stop_signal=self._stop_signal, envvars=self._env, stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT, popen_kwargs=self._popen_kwargs,
            )
            self._executor.start()

    def wait_ready(self, timeout: float) -> None:
        """Block until the readiness probe passes; RuntimeError with the log tail if the process dies or time runs out."""
        deadline = time.monotonic() + timeout
        while True:
            proc = self._executor.process if self._executor else None
            if proc is None or proc.poll() is not None:
                code = proc.returncode if proc is not None else None
                raise RuntimeError(f"{self.name} exited (code {code}) before it was ready\n{log_tail(self.log_path)}")
            if self._probe():
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} not ready after {timeout}s\n{log_tail(self.log_path)}")
            time.sleep(0.05)

    def _signal(self, sig: int) -> None:
        if self.running():
            os.killpg(self.pid, sig)

    def pause(self) -> None:
        """Freeze the whole server process group (SIGSTOP)."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        """Continue a paused server (SIGCONT)."""
        self._signal(signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL the server's process group and reap it; the data dir is kept for ``restart``."""
        if self._executor is not None:
            self._executor.kill()

    def restart(self, timeout: float = 60) -> None:
        """Kill the server if running, start it on the same port(s) and data dir, and wait until ready."""
        self.kill()
        self.spawn()
        self.wait_ready(timeout)

    def stop(self) -> None:
        """Stop gracefully (SIGKILL after the stop timeout) and remove the server's dir. Idempotent."""
        if self._executor is not None and self.running():
            self.resume()
            try:
                self._executor.stop()
            except ProcessFinishedWithError:
                pass  # a non-zero exit code on shutdown is fine here
        self._executor = None
        self._stopped = True
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def launch(handle: ServerHandle, timeout: float) -> ServerHandle:
    """Spawn ``handle`` and wait until ready; on failure stop it (removing its dir) and re-raise."""
    try:
        handle.spawn()
        handle.wait_ready(timeout)
    except BaseException:
        handle.stop()
        raise
    return handle
