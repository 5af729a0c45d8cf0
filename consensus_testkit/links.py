"""The links between a cluster's nodes, each through its own TCP proxy, in a process of their own.

A cluster launcher gives every node a view of its peers at proxy ports: the
link ``"1>2:quorum"`` is node 1's connection to node 2's quorum port, and only
that link crosses its proxy. ``Links.start(directory, {name: (listen_port,
target_port)})`` starts the proxies (``consensus_testkit.proxy.TcpProxy``)
in a child process, so that a busy test process never delays the nodes'
heartbeats; any process that knows the control socket (``Links.attach``) can
``stall`` (a partition: connections stay open, nothing flows), ``drop``
(connections reset, new ones refused) and ``heal`` links by name. Every
request waits at most ``REQUEST_TIMEOUT``.

Run as ``python -m consensus_testkit.links SPEC.json`` by ``Links.start``
only; the spec names the control socket and the links.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

from consensus_testkit.peer_router import PeerRouter
from consensus_testkit.proxy import TcpProxy

#: Bound of one control request and of the process's start.
REQUEST_TIMEOUT = 10.0
START_TIMEOUT = 30.0
ACTIONS = ("stall", "drop", "heal")
#: How long a link waits for a peer's port to accept (a node becoming leader opens its quorum port late).
CONNECT_RETRY = 3.0


class Links:
    """A handle on a links process: its control socket and PID (see the module docstring)."""

    def __init__(self, socket_path: Path, pid: int | None, names: Iterable[str]) -> None:
        self.socket_path = socket_path
        self.pid = pid
        self.names = frozenset(names)
        self._process: subprocess.Popen[bytes] | None = None

    @classmethod
    def start(
        cls,
        directory: Path,
        links: Mapping[str, tuple[int, int]],
        routers: Mapping[int, Mapping[int, int]] | None = None,
    ) -> Links:
        """Start the proxies of ``links`` (name -> (listen port, target port)) in a child process and
        wait until it answers; RuntimeError with its log if it does not within ``START_TIMEOUT``.
        ``routers``: listen port -> {a source node's listening port: the port of its link's proxy}
        (``consensus_testkit.peer_router``, for peers that share one address per node)."""
        directory.mkdir(parents=True, exist_ok=True)
        spec, log = directory / "links.json", directory / "links.log"
        socket_path = directory / "links.sock"
        spec.write_text(json.dumps({"socket": str(socket_path), "links": links, "routers": routers or {}}))
        with log.open("ab") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "consensus_testkit.links", str(spec)],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        handle = cls(socket_path, process.pid, links)
        handle._process = process
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"the links process exited: {log.read_text(errors='replace')[-2000:]}")
            with contextlib.suppress(OSError, RuntimeError):
                handle._request("ping")
                return handle
            if time.monotonic() > deadline:
                handle.stop()
                raise RuntimeError(f"the links process did not answer within {START_TIMEOUT:g}s")
            time.sleep(0.05)

    def describe(self) -> dict[str, object]:
        """What ``attach`` needs, for a control file."""
        return {"socket": str(self.socket_path), "pid": self.pid, "names": sorted(self.names)}

    @classmethod
    def attach(cls, description: Mapping[str, object]) -> Links:
        """A handle on the links process ``describe()`` described (in another process)."""
        names = description["names"]
        pid = description.get("pid")
        assert isinstance(names, list)
        return cls(Path(str(description["socket"])), pid if isinstance(pid, int) else None, names)

    def stall(self, names: Iterable[str]) -> None:
        """Stop forwarding on the links ``names`` (a partition); ValueError for unknown names."""
        self._act("stall", names)

    def drop(self, names: Iterable[str]) -> None:
        """Reset every connection of the links ``names`` and refuse new ones until ``heal``."""
        self._act("drop", names)

    def heal(self, names: Iterable[str] | None = None) -> None:
        """Forward again on the links ``names`` (all links when None)."""
        self._act("heal", self.names if names is None else names)

    def _act(self, action: str, names: Iterable[str]) -> None:
        chosen = sorted(set(names))
        unknown = set(chosen) - self.names
        if unknown:
            raise ValueError(f"unknown links {sorted(unknown)}; known: {sorted(self.names)}")
        if chosen:
            self._request(f"{action} {' '.join(chosen)}")

    def _request(self, line: str) -> None:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(REQUEST_TIMEOUT)
            sock.connect(str(self.socket_path))
            sock.sendall(line.encode() + b"\n")
            answer = sock.makefile("rb").readline().decode().strip()
        if answer != "ok":
            raise RuntimeError(f"the links process refused {line!r}: {answer or 'no answer'}")

    def stop(self) -> None:
        """End the links process (SIGKILL: it holds no state); idempotent."""
        if self.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        if self._process is not None:
            self._process.wait(REQUEST_TIMEOUT)
        self.socket_path.unlink(missing_ok=True)


def _serve(spec: Path) -> None:
    """The links process: one proxy per link, commands on the control socket, until killed."""
    data = json.loads(spec.read_text())
    proxies = {
        name: TcpProxy(int(target), listen_port=int(listen), connect_retry=CONNECT_RETRY)
        for name, (listen, target) in data["links"].items()
    }
    for listen, routes in data.get("routers", {}).items():
        PeerRouter(int(listen), {int(port): int(link) for port, link in routes.items()})
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    Path(data["socket"]).unlink(missing_ok=True)
    server.bind(data["socket"])
    server.listen(16)
    while True:
        connection, _ = server.accept()
        threading.Thread(target=_answer, args=(connection, proxies), daemon=True).start()


def _answer(connection: socket.socket, proxies: Mapping[str, TcpProxy]) -> None:
    with connection:
        connection.settimeout(REQUEST_TIMEOUT)
        try:
            action, *names = connection.makefile("rb").readline().decode().split()
        except (OSError, ValueError, UnicodeDecodeError):
            return
        if action == "ping":
            answer = "ok"
        elif action in ACTIONS and all(name in proxies for name in names):
            for name in names:
                getattr(proxies[name], action)()
            answer = "ok"
        else:
            answer = f"error: unknown request {action!r} or link in {names}"
        with contextlib.suppress(OSError):
            connection.sendall(answer.encode() + b"\n")


if __name__ == "__main__":
    _serve(Path(sys.argv[1]))
