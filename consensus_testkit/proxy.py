"""A small threaded TCP proxy on loopback, to cut clients off a server that keeps running.

::

    with TcpProxy(server.proxy_target, listen_port=server.proxy_port or 0) as proxy:
        url = proxy.url_for(server_url)   # the same URL through the proxy
        proxy.stall()                     # a partition: nothing flows, connections stay open
        proxy.heal()                      # everything flows again
        proxy.drop()                      # every connection closed (RST); new ones refused
        proxy.heal()
        proxy.stall_after(1)              # the server's first reply goes through, then a partition

``stall`` is what a network partition looks like to both ends: bytes already
sent sit in the kernels' buffers and the peers' TCP stacks keep the
connections up, but no request reaches the server and no answer the client.
``heal`` lets the stalled bytes through, as TCP retransmission would after a
partition heals. ``drop`` is what a crashed middlebox or a firewall reset
looks like: every connection is reset and new connections are reset on
accept until ``heal``. ``stall_after(n)`` stalls once ``n`` replies (what one
read from the server returns) went through: a server that answers a
handshake, then goes silent. A connection the target refuses is reset; with
``connect_retry`` the proxy first retries that long (a peer about to listen,
such as a ZooKeeper server becoming leader, is reached rather than reset).

Each connection has two pump threads; all threads are daemons and every wait
is bounded, so ``close`` returns within about a second.
"""

from __future__ import annotations

import contextlib
import select
import socket
import struct
import threading
import time
from collections.abc import Sequence
from urllib.parse import urlsplit, urlunsplit

from consensus_api.closing import Closing

#: The loopback address every test server listens on (``consensus_testkit.host.HOST``); kept
#: here too so the proxy works without the launchers' ``testing`` extra.
HOST = "127.0.0.1"

#: How often blocked threads look at the proxy's state, in seconds.
TICK = 0.05
_LINGER_RESET = struct.pack("ii", 1, 0)


class _Link:
    """One client connection and its upstream connection."""

    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client = client
        self.upstream = upstream
        self.closed = threading.Event()

    def close(self, reset: bool = False) -> None:
        if self.closed.is_set():
            return
        self.closed.set()
        for sock in (self.client, self.upstream):
            with contextlib.suppress(OSError):
                if reset:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()


class TcpProxy(Closing):
    """Forwards ``listen_host:listen_port`` to ``target_host:target_port``; see the module docstring."""

    def __init__(
        self,
        target_port: int,
        *,
        target_host: str = HOST,
        listen_port: int = 0,
        listen_host: str = HOST,
        connect_retry: float = 0.0,
    ) -> None:
        self.target = (target_host, target_port)
        #: Seconds a new connection waits for the target to accept before it is reset (0: one attempt).
        self.connect_retry = connect_retry
        self.host = listen_host
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._listener.bind((listen_host, listen_port))
        except OSError:
            self._listener.close()
            raise
        self._listener.listen(128)
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._flowing = threading.Event()
        self._flowing.set()
        self._refusing = False
        self._replies_left: int | None = None
        self._closed = False
        self._links: set[_Link] = set()
        self._threads: list[threading.Thread] = []
        self._start(self._accept, "consensus-proxy-accept")

    # Faults

    def stall(self) -> None:
        """Stop forwarding in both directions; connections stay open (a partition)."""
        self._flowing.clear()

    def stall_after(self, replies: int) -> None:
        """Forward ``replies`` more reads from the server (counted over every connection), then stall."""
        with self._lock:
            self._replies_left = replies
        if replies <= 0:
            self.stall()

    def drop(self) -> None:
        """Reset every connection; refuse (reset) new ones until ``heal``."""
        with self._lock:
            self._refusing = True
            links = list(self._links)
            self._links.clear()
        for link in links:
            link.close(reset=True)

    def heal(self) -> None:
        """Forward again and accept new connections."""
        with self._lock:
            self._refusing = False
            self._replies_left = None
        self._flowing.set()

    @property
    def connections(self) -> int:
        """The number of open client connections."""
        with self._lock:
            return len(self._links)

    def url_for(self, url: str) -> str:
        """``url`` with its host and port replaced by the proxy's (user, path and query kept)."""
        return url_at(url, self.host, self.port)

    # Life cycle

    def close(self) -> None:
        """Close the listener and every connection; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            links = list(self._links)
            self._links.clear()
        self._flowing.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        for link in links:
            link.close(reset=True)
        for thread in self._threads:
            thread.join(1.0)

    def __repr__(self) -> str:
        state = "flowing" if self._flowing.is_set() else "stalled"
        return f"<TcpProxy {self.host}:{self.port} -> {self.target[0]}:{self.target[1]} {state}>"

    # Threads

    def _start(self, target: object, name: str, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)  # type: ignore[arg-type]
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()]
            self._threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                ready, _, _ = select.select([self._listener], [], [], TICK)
                if not ready:
                    continue
                client, _ = self._listener.accept()
            except (OSError, ValueError):
                return  # closed
            self._start(self._connect, "consensus-proxy-connect", client)

    def _refusing_now(self) -> bool:
        with self._lock:
            return self._refusing or self._closed

    def _connect(self, client: socket.socket) -> None:
        """Connect ``client`` upstream (retrying for ``connect_retry`` seconds) and start its pumps; reset
        it if refusing or the target does not accept."""
        deadline = time.monotonic() + self.connect_retry
        upstream: socket.socket | None = None
        while upstream is None and not self._refusing_now():
            try:
                upstream = socket.create_connection(self.target, timeout=2)
            except OSError:
                if time.monotonic() >= deadline:
                    break
                time.sleep(TICK)
        if upstream is None:
            _reset(client)
            return
        upstream.settimeout(None)
        link = _Link(client, upstream)
        with self._lock:
            if self._refusing or self._closed:
                link.close(reset=True)
                return
            self._links.add(link)
        self._start(self._pump, "consensus-proxy-up", link, client, upstream)
        self._start(self._pump, "consensus-proxy-down", link, upstream, client)

    def _pump(self, link: _Link, source: socket.socket, sink: socket.socket) -> None:
        try:
            while not link.closed.is_set():
                if not self._flowing.wait(TICK):
                    continue
                ready, _, _ = select.select([source], [], [], TICK)
                if not ready or not self._flowing.is_set():
                    continue
                data = source.recv(65536)
                if not data:
                    break
                sink.sendall(data)
                if source is link.upstream:
                    self._count_reply()
        except (OSError, ValueError):
            pass
        with self._lock:
            self._links.discard(link)
        link.close()

    def _count_reply(self) -> None:
        with self._lock:
            if self._replies_left is None:
                return
            self._replies_left -= 1
            if self._replies_left <= 0:
                self._replies_left = None
                self._flowing.clear()


class ProxyGroup(Closing):
    """One ``TcpProxy`` per ``(listen port, target port)`` of ``fronts`` (``ServerHandle.fronts``; listen
    port 0: any free one), faulted together: ``stall``, ``drop`` and ``heal`` act on every proxy;
    ``url_for`` names the first. A client that every server sends on to one of these ports (Kafka's
    advertised listeners) is cut off as a whole."""

    def __init__(self, fronts: Sequence[tuple[int, int]]) -> None:
        if not fronts:
            raise ValueError("a ProxyGroup needs at least one (listen port, target port)")
        self.proxies: list[TcpProxy] = []
        try:
            for listen, target in fronts:
                self.proxies.append(TcpProxy(target, listen_port=listen))
        except BaseException:
            self.close()
            raise

    def stall(self) -> None:
        """``TcpProxy.stall`` on every proxy."""
        for proxy in self.proxies:
            proxy.stall()

    def drop(self) -> None:
        """``TcpProxy.drop`` on every proxy."""
        for proxy in self.proxies:
            proxy.drop()

    def heal(self) -> None:
        """``TcpProxy.heal`` on every proxy."""
        for proxy in self.proxies:
            proxy.heal()

    def url_for(self, url: str) -> str:
        """``url`` through the first proxy."""
        return self.proxies[0].url_for(url)

    def close(self) -> None:
        """Close every proxy; idempotent."""
        for proxy in self.proxies:
            proxy.close()

    def __repr__(self) -> str:
        return f"<ProxyGroup {self.proxies}>"


def url_at(url: str, host: str, port: int) -> str:
    """``url`` with its host and port replaced by ``host:port`` (user, path and query kept)."""
    parts = urlsplit(url)
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = f"{userinfo}@{host}:{port}" if userinfo else f"{host}:{port}"
    return urlunsplit(parts._replace(netloc=netloc))


def _reset(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
    with contextlib.suppress(OSError):
        sock.close()
