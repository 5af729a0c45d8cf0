"""Process, port and readiness helpers shared by the real test servers.

Every server runs in its own session (mirakuru starts it with ``setsid``); it
and its descendants are signalled by PID only, never by name, and only while
that PID still names the process it was taken from (``consensus_testkit.pids``).
Its output goes to ``<dir>/server.log``.

A handle can be handed to another process through a *control file*
(``ServerHandle.write_control`` / ``ServerHandle.attach``): JSON with the
server's name, URL, ports, data dir, command, and current PID and its creation
time. A handle that restarts the server writes the new process back, and
``stop`` of any handle bound to the file stops the process the file names at
that moment, so the process that started the server also stops a server
another process restarted.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import psutil
from mirakuru.exceptions import ProcessFinishedWithError

from consensus_api.config import redact_text
from consensus_testkit.host import HOST, log_tail
from consensus_testkit.pids import (
    SessionExecutor,
    alive,
    family_of,
    process_at,
    signal_all,
    wait_gone,
    wait_reaped,
)


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
        proxy_port: int | None = None,
        proxy_target: int | None = None,
    ) -> None:
        self.name = name
        self.url = url
        self.host = HOST
        self.port = port
        self.directory = directory
        self.log_path = directory / "server.log"
        #: The port a TCP proxy in front of this server must listen on (None: any free port). Kafka
        #: advertises a listener at this address, so clients that bootstrap through the proxy stay on it.
        self.proxy_port = proxy_port
        #: The server port a TCP proxy forwards to.
        self.proxy_target = proxy_target if proxy_target is not None else port
        self._command = list(command)
        self._probe = probe
        self._stop_signal = stop_signal
        self._stop_timeout = stop_timeout
        self._popen_kwargs = popen_kwargs or {}
        self._executor: SessionExecutor | None = None
        self._started: psutil.Process | None = None  # the server process the executor started
        self._adopted: psutil.Process | None = None  # one this handle did not start with mirakuru
        self._spawned: subprocess.Popen[bytes] | None = None  # one an attached handle started
        self._attached = False
        self._control: Path | None = None
        self._stopped = False

    @property
    def fronts(self) -> list[tuple[int, int]]:
        """(listen port, 0 for any; target port) of each TCP proxy that together cut a client off this
        server (``proxy.ProxyGroup``); a client's URL names the first."""
        return [(self.proxy_port or 0, self.proxy_target)]

    def __repr__(self) -> str:
        return f"<ServerHandle {self.name} {redact_text(self.url)} pid={self._pid_or_none()}>"

    @property
    def pid(self) -> int:
        """PID of the server process (JVM, etcd binary or postmaster)."""
        pid = self._pid_or_none()
        if pid is None:
            raise RuntimeError(f"{self.name} is not running")
        return pid

    def _pid_or_none(self) -> int | None:
        process = self._server_process()
        return process.pid if process is not None else None

    def running(self) -> bool:
        """True while the server process exists (paused counts as running)."""
        if self._executor is not None:
            return self._executor.running()
        if self._spawned is not None:
            self._spawned.poll()  # reap it if it died
        return self._adopted is not None and alive(self._adopted)

    def _live_processes(self) -> list[psutil.Process]:
        """The server processes alive now: the one the executor started, and an adopted one."""
        known = [process for process in (self._started, self._adopted) if process is not None]
        return [process for process in dict.fromkeys(known) if alive(process)]

    def _server_process(self) -> psutil.Process | None:
        live = self._live_processes()
        return live[0] if live else None

    # Control files: handing the server to another process

    def write_control(self, path: Path) -> None:
        """Describe this server in the JSON file ``path`` and keep its PID there current.

        ``consensus_testkit.control.attach_server(path)`` in another process rebuilds a handle that
        can pause, kill and restart the server; ``stop`` on either stops the
        process the file names.
        """
        self._control = path
        self._save_control()
        threading.Thread(target=self._reap, name=f"{self.name}-reaper", daemon=True).start()

    def _reap(self) -> None:
        """Reap our server process as soon as it dies (another process may kill it): PostgreSQL's
        restart refuses to start while the old postmaster's PID exists, even as a zombie."""
        while not self._stopped:
            executor = self._executor
            proc = executor.process if executor is not None else None
            if proc is not None:
                proc.poll()
            time.sleep(0.05)

    @classmethod
    def attach(cls, path: Path, probe_for: Callable[[str, int, Path], Callable[[], bool]]) -> ServerHandle:
        """A handle on the server described by the control file ``path`` (see ``write_control``);
        ``probe_for(name, port, directory)`` gives its readiness probe
        (``consensus_testkit.control.attach_server`` passes the launcher's).

        Raises ValueError if the file is unreadable.
        """
        try:
            data = json.loads(Path(path).read_text())
            name, port = str(data["name"]), int(data["port"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"unreadable server control file {path}: {exc}") from None
        handle = cls(
            name,
            str(data["url"]),
            port,
            Path(data["directory"]),
            command=[str(part) for part in data["command"]],
            probe=probe_for(name, port, Path(data["directory"])),
            stop_signal=int(data["stop_signal"]),
            stop_timeout=float(data["stop_timeout"]),
            popen_kwargs=dict(data["popen_kwargs"]),
            proxy_port=data.get("proxy_port"),
            proxy_target=data.get("proxy_target"),
        )
        handle._control = Path(path)
        handle._adopted = process_at(data.get("pid"), data.get("started"))
        handle._attached = True
        return handle

    def _save_control(self) -> None:
        if self._control is None:
            return
        data = {
            "name": self.name,
            "url": self.url,
            "host": self.host,
            "port": self.port,
            "proxy_port": self.proxy_port,
            "proxy_target": self.proxy_target,
            "directory": str(self.directory),
            "command": self._command,
            "stop_signal": int(self._stop_signal),
            "stop_timeout": self._stop_timeout,
            "popen_kwargs": self._popen_kwargs,
            **self._identity(),
        }
        staging = self._control.with_name(self._control.name + ".tmp")
        staging.write_text(json.dumps(data, indent=1))
        os.replace(staging, self._control)

    def _identity(self) -> dict[str, object]:
        """The running server process as a control file names it: its PID and creation time."""
        process = self._server_process()
        with contextlib.suppress(psutil.NoSuchProcess):
            if process is not None:
                return {"pid": process.pid, "started": process.create_time()}
        return {"pid": None, "started": None}

    def _adopt_current(self) -> None:
        """Adopt the process the control file names if another process restarted the server."""
        if self._control is None:
            return
        try:
            data = json.loads(self._control.read_text())
            process = process_at(data.get("pid"), data.get("started"))
        except (OSError, ValueError, AttributeError):
            return
        if process is not None and process != self._started and alive(process):
            self._adopted = process

    def spawn(self) -> None:
        """Start the server process without waiting for readiness."""
        if self._stopped:
            raise RuntimeError(f"{self.name} was stopped and its data removed; start a new server")
        if self.running():
            raise RuntimeError(f"{self.name} is already running")
        if self._executor is not None:
            self._executor.kill()  # reap a process that died on its own, and its leftovers
        if self._attached:
            self._spawn_detached()
            return
        with self.log_path.open("ab") as log:
            self._executor = SessionExecutor(
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
        self._started = process_at(self._executor.process.pid if self._executor.process else None)
        self._adopted = None
        self._save_control()

    def _spawn_detached(self) -> None:
        """An attached handle's start: a plain child in its own session, which outlives this
        process (mirakuru would kill it at exit); the process that wrote the control file stops it."""
        with self.log_path.open("ab") as log:
            self._spawned = subprocess.Popen(
                self._command,
                cwd=str(self.directory),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                **self._popen_kwargs,
            )
        self._adopted = process_at(self._spawned.pid)
        self._save_control()

    def wait_ready(self, timeout: float) -> None:
        """Block until the readiness probe passes.

        Raises RuntimeError with the log tail if the process dies or ``timeout`` seconds pass.
        """
        deadline = time.monotonic() + timeout
        while True:
            proc = self._executor.process if self._executor else self._spawned
            if not self.running():
                code = proc.returncode if proc is not None else None
                raise RuntimeError(
                    f"{self.name} exited (code {code}) before it was ready\n{log_tail(self.log_path)}"
                )
            if self._probe():
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} not ready after {timeout}s\n{log_tail(self.log_path)}")
            time.sleep(0.05)

    def _family(self) -> list[psutil.Process]:
        """The server process and its descendants (PostgreSQL's children start their own sessions)."""
        return [member for root in self._live_processes() for member in family_of(root)]

    def pause(self) -> None:
        """Freeze the server process and all its descendants (SIGSTOP).

        Repeated until no new descendant shows up: a child forked while the
        family was being stopped (PostgreSQL forks a backend per connection)
        would otherwise keep serving.
        """
        stopped: set[psutil.Process] = set()
        for _ in range(20):
            fresh = [process for process in self._family() if process not in stopped]
            if not fresh:
                return
            signal_all(fresh, signal.SIGSTOP)
            stopped.update(fresh)
            time.sleep(0.01)

    def resume(self) -> None:
        """Continue a paused server (SIGCONT)."""
        signal_all(self._family(), signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL the server and its descendants and wait until they are gone; the data dir is kept."""
        family = self._family()
        if self._executor is not None:
            self._executor.kill()
        signal_all(family, signal.SIGKILL)
        wait_gone(family, self._stop_timeout)
        if self._spawned is not None:
            self._spawned.wait(self._stop_timeout)  # no zombie: PostgreSQL would see its PID alive
        if self._adopted is not None:
            wait_reaped(self._adopted, 5.0)  # another process's child: its reaper takes it
        self._adopted = None

    def restart(self, timeout: float = 60) -> None:
        """Kill the server if running, start it on the same port(s) and data dir, and wait until ready."""
        self.kill()
        self.spawn()
        self.wait_ready(timeout)

    def stop(self) -> None:
        """Stop gracefully (SIGKILL after the stop timeout) and remove the server's dir. Idempotent.

        With a control file, the process it names is stopped too (another process may have restarted
        the server).
        """
        self._adopt_current()
        family = self._family()
        signal_all(family, signal.SIGCONT)
        if self._executor is not None:
            if self._executor.running():
                with contextlib.suppress(ProcessFinishedWithError):  # a non-zero exit code is fine here
                    self._executor.stop()
            self._executor.kill()  # reaps a process that died on its own, with its marked leftovers
        if self._adopted is not None and alive(self._adopted):
            signal_all([self._adopted], self._stop_signal)
            with contextlib.suppress(RuntimeError):
                wait_gone([self._adopted], self._stop_timeout)
        signal_all([process for process in family if alive(process)], signal.SIGKILL)
        wait_gone(family, self._stop_timeout)
        self._executor = None
        self._started = self._adopted = None
        self._stopped = True
        if self._control is not None:
            self._control.unlink(missing_ok=True)
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def launch(handle: ServerHandle, timeout: float, *, then: Callable[[], object] | None = None) -> ServerHandle:
    """Spawn ``handle``, wait until ready, then run ``then`` (a set-up through the running server,
    such as users and ACLs); on failure stop it (removing its dir) and re-raise."""
    try:
        handle.spawn()
        handle.wait_ready(timeout)
        if then is not None:
            then()
    except BaseException:
        handle.stop()
        raise
    return handle
