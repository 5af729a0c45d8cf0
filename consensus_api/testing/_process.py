"""Process, port and readiness helpers shared by the real test servers.

Every server runs in its own session (mirakuru starts it with ``setsid``); it
and its descendants are signalled by PID only, never by name. Its output goes
to ``<dir>/server.log``.
"""

from __future__ import annotations

import contextlib
import os
import random
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


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """Return a loopback port that was free a moment ago and never handed out before by this process.

    Ports come from below the ephemeral range: a port bind(0) hands out may be taken as the local
    port of any outgoing connection before the server binds it.
    """
    high = _ephemeral_low() - 1
    for _ in range(200):
        port = random.randint(min(10000, high // 2), high)
        if port in _issued_ports:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((HOST, port))
            except OSError:
                continue
        _issued_ports.add(port)
        return port
    raise RuntimeError("no free loopback port found")


def cache_dir() -> Path:
    """The cache shared with scripts/install.sh: ``$CONSENSUS_CACHE`` or ``~/.cache/consensus-api``."""
    return Path(os.environ.get("CONSENSUS_CACHE") or Path.home() / ".cache" / "consensus-api")


def java_binary() -> str:
    """``java`` on PATH; RuntimeError naming scripts/install.sh when missing."""
    java = shutil.which("java")
    if java is None:
        raise RuntimeError("java not found: run scripts/install.sh")
    return java


def log_tail(path: Path, lines: int = 40) -> str:
    """Return the last ``lines`` lines of a log file, or a note that it is missing."""
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        return f"<no log: {exc}>"
    return "\n".join(text.splitlines()[-lines:])


def run_checked(cmd: Sequence[str], log: Path, what: str, timeout: float = 120, **kwargs: Any) -> None:
    """Run a setup command, output appended to ``log``; RuntimeError with the log tail on failure."""
    with log.open("ab") as out:
        try:
            proc = subprocess.run(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=timeout,
                check=False,
                **kwargs,
            )
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


def _descendants(pid: int) -> list[int]:
    """PIDs of all descendants of ``pid``, read from /proc."""
    children: dict[int, list[int]] = {}
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat_file.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # the process exited meanwhile
        children.setdefault(ppid, []).append(int(stat_file.parent.name))
    found: list[int] = []
    todo = [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        found.extend(kids)
        todo.extend(kids)
    return found


def _alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _send(pids: Sequence[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _wait_gone(pids: Sequence[int], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while any(_alive(pid) for pid in pids):
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes {[p for p in pids if _alive(p)]} survived SIGKILL for {timeout}s")
        time.sleep(0.01)


class ServerHandle:
    """One running real server: its client address, URL and a control handle.

    ``restart`` reuses the same command, port(s) and data dir. ``stop`` is
    graceful with a SIGKILL fallback, removes the server's dir and is
    idempotent; afterwards no process of the server is left.
    """

    def __init__(
        self,
        name: str,
        url: str,
        port: int,
        directory: Path,
        *,
        command: Sequence[str],
        probe: Callable[[], bool],
        stop_signal: int = signal.SIGTERM,
        stop_timeout: float = 30,
        popen_kwargs: dict[str, Any] | None = None,
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
        self._executor: _SessionExecutor | None = None
        self._stopped = False

    def __repr__(self) -> str:
        return f"<ServerHandle {self.name} {self.url} pid={self._pid_or_none()}>"

    @property
    def pid(self) -> int:
        """PID of the server process (JVM, etcd binary or postmaster)."""
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
        if self._executor is not None:
            self._executor.kill()  # reap a process that died on its own, and its leftovers
        with self.log_path.open("ab") as log:
            self._executor = _SessionExecutor(
                self._command,
                cwd=str(self.directory),
                timeout=self._stop_timeout,
                stop_signal=self._stop_signal,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                popen_kwargs=self._popen_kwargs,
            )
            self._executor.start()

    def wait_ready(self, timeout: float) -> None:
        """Block until the readiness probe passes.

        Raises RuntimeError with the log tail if the process dies or ``timeout`` seconds pass.
        """
        deadline = time.monotonic() + timeout
        while True:
            proc = self._executor.process if self._executor else None
            if proc is None or proc.poll() is not None:
                code = proc.returncode if proc is not None else None
                raise RuntimeError(
                    f"{self.name} exited (code {code}) before it was ready\n{log_tail(self.log_path)}"
                )
            if self._probe():
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} not ready after {timeout}s\n{log_tail(self.log_path)}")
            time.sleep(0.05)

    def _family(self) -> list[int]:
        """The server process and its descendants (PostgreSQL's children start their own sessions)."""
        return [self.pid, *_descendants(self.pid)] if self.running() else []

    def pause(self) -> None:
        """Freeze the server process and all its descendants (SIGSTOP)."""
        _send(self._family(), signal.SIGSTOP)

    def resume(self) -> None:
        """Continue a paused server (SIGCONT)."""
        _send(self._family(), signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL the server and its descendants and wait until they are gone; the data dir is kept."""
        family = self._family()
        if self._executor is not None:
            self._executor.kill()
        _send(family, signal.SIGKILL)
        _wait_gone(family, self._stop_timeout)

    def restart(self, timeout: float = 60) -> None:
        """Kill the server if running, start it on the same port(s) and data dir, and wait until ready."""
        self.kill()
        self.spawn()
        self.wait_ready(timeout)

    def stop(self) -> None:
        """Stop gracefully (SIGKILL after the stop timeout) and remove the server's dir. Idempotent."""
        family = self._family()
        if self._executor is not None:
            if self.running():
                self.resume()
                with contextlib.suppress(ProcessFinishedWithError):  # a non-zero exit code is fine here
                    self._executor.stop()
            self._executor.kill()  # reaps a process that died on its own, with its marked leftovers
        _send([pid for pid in family if _alive(pid)], signal.SIGKILL)
        _wait_gone(family, self._stop_timeout)
        self._executor = None
        self._stopped = True
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
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


class _SessionExecutor(SimpleExecutor):
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
