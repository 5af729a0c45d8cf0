"""Per-link proxies for servers whose peers all dial one shared address per node (etcd).

An etcd member's peer URL is part of the cluster's identity (member ids are
hashed from it), so every member reaches node ``m`` at the same address and
the per-link proxies of ``consensus_testkit.links`` cannot be told apart
by port. A ``PeerRouter`` listens at node ``m``'s advertised peer address and
hands every accepted connection to the proxy of the link it belongs to
(``"k>m:peer"``), which forwards it to ``m``'s real peer port: the source node
``k`` is the process owning the connection's other end (found through the
kernel's socket table with psutil), identified by a port it listens on. A
connection whose source is no known node is reset. Stalling a link's proxy
therefore stalls exactly the connections from ``k`` to ``m``.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
from collections.abc import Mapping

import psutil

from consensus_testkit.proxy import HOST, TICK, _reset

#: Bound of connecting to a link's proxy.
CONNECT_TIMEOUT = 2.0


class PeerRouter:
    """Accepts on ``listen_port`` and routes each connection to ``links[source node's listening port]``
    (a link proxy's port); see the module docstring. Runs daemon threads until the process ends."""

    def __init__(self, listen_port: int, links: Mapping[int, int]) -> None:
        self.links = dict(links)
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((HOST, listen_port))
        self._listener.listen(128)
        threading.Thread(target=self._accept, name="consensus-router-accept", daemon=True).start()

    def _accept(self) -> None:
        while True:
            client, _ = self._listener.accept()
            threading.Thread(target=self._route, args=(client,), name="consensus-router", daemon=True).start()

    def source_port(self, client: socket.socket) -> int | None:
        """The port of ``links`` the process at the other end of ``client`` listens on, or None."""
        remote = client.getpeername()[:2]
        connections = psutil.net_connections("tcp4")
        owner = next((c.pid for c in connections if c.laddr and tuple(c.laddr) == remote), None)
        if owner is None:
            return None
        listening = {
            c.laddr[1] for c in connections if c.pid == owner and c.status == psutil.CONN_LISTEN and c.laddr
        }
        return next((port for port in listening if port in self.links), None)

    def _route(self, client: socket.socket) -> None:
        try:
            port = self.source_port(client)
            if port is None:
                _reset(client)
                return
            upstream = socket.create_connection((HOST, self.links[port]), timeout=CONNECT_TIMEOUT)
        except (OSError, psutil.Error):
            _reset(client)
            return
        upstream.settimeout(None)
        done = threading.Event()
        threading.Thread(target=_pump, args=(client, upstream, done), daemon=True).start()
        _pump(upstream, client, done)


def _pump(source: socket.socket, sink: socket.socket, done: threading.Event) -> None:
    """Copy ``source`` to ``sink`` until either side closes; then close both."""
    with contextlib.suppress(OSError, ValueError):
        while not done.is_set():
            ready, _, _ = select.select([source], [], [], TICK)
            if ready:
                data = source.recv(65536)
                if not data:
                    break
                sink.sendall(data)
    done.set()
    for sock in (source, sink):
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            sock.close()
