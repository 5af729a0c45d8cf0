"""Partitions made by the kernel: a Linux network namespace whose only link to the host can be cut.

::

    if why_unavailable() is None:
        with NetworkNamespace() as netns:
            netns.forward(server.proxy_port or server.port, server.proxy_target)
            child = subprocess.Popen([*netns.prefix, sys.executable, "client.py"])  # runs inside
            netns.cut()    # a partition: the link is down, nothing crosses it, nothing is refused
            netns.heal()   # the link is up again; TCP retransmits what was lost

**Layout.** The namespace is joined to the host by a veth pair on its own /30
of 198.18.0.0/15 (RFC 2544's range for benchmarks, unused by real networks);
the first free one is picked under a file lock, so parallel runs never share
one. Test servers listen on the host's 127.0.0.1, which a process inside
cannot reach, so ``forward`` starts two TCP proxies (``consensus_testkit.
proxy``): a process inside listens on the namespace's 127.0.0.1 at the port
the client's URL (or Kafka's metadata) names and forwards across the link to
a proxy on the host end of the link, which forwards to the server. A client's
own connections stay on the namespace's loopback; the inside proxy's
connections cross the link.

**The cut** sets the inside end of the link down. The host end loses carrier
and drops what the host sends; inside, a fallback route through a second
veth whose peer is down (with a static neighbour entry, so no ARP failure
turns into an ICMP error) drops what the namespace sends. Nothing is refused
or reset and no ICMP error is generated: established connections stay open
and go silent while TCP retransmits into the void, new connections hang in
SYN_SENT. After ``heal`` the retransmissions get through on TCP's backoff
schedule, as after a real partition. A connection a client opens during the
cut is accepted by the inside proxy and reset when that proxy's upstream
connect gives up (2 s).

``close`` (also on errors) kills what still runs inside, stops the proxies and
deletes the link and the namespace. ``why_unavailable()`` says why namespaces
cannot be used on this machine (not Linux, not root, no ``ip``, setting one
up fails), or None.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import ipaddress
import os
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from consensus_api.closing import Closing
from consensus_testkit.proxy import TcpProxy

#: Where links get their /30 subnets: RFC 2544's benchmarking range.
ADDRESS_RANGE = ipaddress.IPv4Network("198.18.0.0/15")
#: Held while a subnet is picked and assigned, by every process on the machine.
LOCK_PATH = Path(tempfile.gettempdir()) / "consensus-netns.lock"
#: Bounds of the waits: one ``ip`` command, the subnet lock, a forwarder's start, a process's death.
IP_TIMEOUT = 10.0
LOCK_TIMEOUT = 30.0
READY_TIMEOUT = 30.0
EXIT_TIMEOUT = 5.0

_INSIDE_LINK = "uplink"
_SINK, _SINK_PEER = "sink", "sink-peer"
_SINK_NEIGHBOUR = "02:00:00:00:00:01"
_FALLBACK_METRIC = 1000


class NamespaceError(RuntimeError):
    """A namespace, its link or a forwarder could not be set up or removed."""


class NetworkNamespace(Closing):
    """A uniquely named network namespace, linked to the host by a veth pair that ``cut`` brings down.

    Creating one needs root (``CAP_NET_ADMIN``, ``CAP_SYS_ADMIN``) and iproute2;
    ``NamespaceError`` otherwise, with nothing left behind. See the module docstring.
    """

    def __init__(self) -> None:
        token = secrets.token_hex(4)
        #: The namespace's name (``ip netns``): unique per process and call.
        self.name = f"consensus-{os.getpid()}-{token}"
        #: The host end of the link (an interface name of at most 15 characters).
        self.link = f"ct{token}"
        self.host_address = ""
        self.inside_address = ""
        self._proxies: list[TcpProxy] = []
        self._forwarders: list[subprocess.Popen[str]] = []
        self._exists = False
        try:
            _ip("netns", "add", self.name)
            self._exists = True
            self._link()
        except BaseException:
            self.close()
            raise

    def _link(self) -> None:
        with _subnet_lock():
            subnet = _free_subnet(_used_networks())
            host, inside = (str(address) for address in subnet.hosts())
            _ip("link", "add", self.link, "type", "veth", "peer", "name", _INSIDE_LINK, "netns", self.name)
            _ip("address", "add", f"{host}/30", "dev", self.link)
        self.host_address, self.inside_address = host, inside
        _ip("link", "set", self.link, "up")
        inside_commands = [
            "link set lo up",
            f"address add {inside}/30 dev {_INSIDE_LINK}",
            f"link set {_INSIDE_LINK} up",
            f"link add {_SINK} type veth peer name {_SINK_PEER}",
            f"link set {_SINK} up",
            f"route add {subnet} dev {_SINK} metric {_FALLBACK_METRIC}",
            f"neighbour add {host} lladdr {_SINK_NEIGHBOUR} dev {_SINK} nud permanent",
        ]
        _ip("-n", self.name, "-batch", "-", stdin="\n".join(inside_commands) + "\n")

    @property
    def prefix(self) -> list[str]:
        """The command prefix that runs a program inside: ``[*netns.prefix, program, *args]``."""
        return ["ip", "netns", "exec", self.name]

    def forward(self, inside_port: int, target_port: int) -> None:
        """Make ``127.0.0.1:inside_port`` inside lead to ``127.0.0.1:target_port`` on the host, across
        the link. Returns once both proxies listen; ``NamespaceError`` if the inside one cannot start."""
        host_proxy = TcpProxy(target_port, listen_host=self.host_address)
        self._proxies.append(host_proxy)
        command = [*self.prefix, sys.executable, "-m", __name__]
        forwarder = subprocess.Popen(
            [*command, str(inside_port), self.host_address, str(host_proxy.port)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._forwarders.append(forwarder)
        assert forwarder.stdout is not None
        ready, _, _ = select.select([forwarder.stdout], [], [], READY_TIMEOUT)
        line = forwarder.stdout.readline().strip() if ready else ""
        if line != "READY":
            errors = _end(forwarder)
            raise NamespaceError(
                f"the forwarder to port {inside_port} in {self.name} did not start within "
                f"{READY_TIMEOUT:g}s: {line or errors[-500:]}"
            )

    def cut(self) -> None:
        """Partition the namespace from the host: the link goes down, and what either side sends is lost."""
        _ip("-n", self.name, "link", "set", _INSIDE_LINK, "down")

    def heal(self) -> None:
        """Bring the link up again; connections that outlived the cut resume when TCP retransmits."""
        _ip("-n", self.name, "link", "set", _INSIDE_LINK, "up")

    def close(self) -> None:
        """Kill what still runs inside, stop the proxies, delete the link and the namespace; idempotent."""
        for forwarder in self._forwarders:
            _end(forwarder)
        self._forwarders.clear()
        for proxy in self._proxies:
            proxy.close()
        self._proxies.clear()
        if not self._exists:
            return
        with contextlib.suppress(NamespaceError):
            for pid in _ip("netns", "pids", self.name).split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
        with contextlib.suppress(NamespaceError):
            _ip("link", "delete", self.link)  # gone already if the namespace was set up halfway
        _ip("netns", "delete", self.name)
        self._exists = False

    def __repr__(self) -> str:
        return f"<NetworkNamespace {self.name} {self.inside_address} <-> {self.link} {self.host_address}>"


@functools.cache
def why_unavailable() -> str | None:
    """Why network namespaces cannot be used on this machine, or None if they can (tried once)."""
    if not sys.platform.startswith("linux"):
        return "network namespaces are a Linux feature"
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    try:
        NetworkNamespace().close()
    except NamespaceError as exc:
        return f"setting one up failed: {exc}"
    return None


def _ip(*args: str, stdin: str | None = None) -> str:
    """Run ``ip ARGS`` and return its output; ``NamespaceError`` with its message when it fails."""
    try:
        done = subprocess.run(
            ["ip", *args], input=stdin, capture_output=True, text=True, timeout=IP_TIMEOUT, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NamespaceError(f"ip {' '.join(args)}: {exc}") from exc
    if done.returncode != 0:
        raise NamespaceError(f"ip {' '.join(args)}: {done.stderr.strip() or f'exit {done.returncode}'}")
    return done.stdout


@contextlib.contextmanager
def _subnet_lock() -> Iterator[None]:
    """Hold the machine-wide lock under which subnets are picked and assigned."""
    with LOCK_PATH.open("a") as handle:
        deadline = time.monotonic() + LOCK_TIMEOUT
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise NamespaceError(f"{LOCK_PATH} stayed locked for {LOCK_TIMEOUT:g}s") from None
                time.sleep(0.05)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _used_networks() -> list[ipaddress.IPv4Network]:
    """The IPv4 networks of the host's interfaces (every link made here has its host end among them)."""
    networks = []
    for line in _ip("-o", "-4", "address", "show").splitlines():
        fields = line.split()
        if "inet" in fields:
            networks.append(ipaddress.IPv4Interface(fields[fields.index("inet") + 1]).network)
    return networks


def _free_subnet(used: Sequence[ipaddress.IPv4Network]) -> ipaddress.IPv4Network:
    """The first /30 of ``ADDRESS_RANGE`` overlapping none of ``used``, searched from one the PID picks."""
    count = ADDRESS_RANGE.num_addresses // 4
    first = int(ADDRESS_RANGE.network_address)
    start = os.getpid() % count
    for offset in range(count):
        subnet = ipaddress.IPv4Network((first + 4 * ((start + offset) % count), 30))
        if not any(subnet.overlaps(network) for network in used):
            return subnet
    raise NamespaceError(f"no free /30 left in {ADDRESS_RANGE}")


def _end(process: subprocess.Popen[str]) -> str:
    """Kill ``process`` (by its PID) if it still runs, reap it, close its pipes; returns its stderr."""
    if process.poll() is None:
        process.kill()
    errors = ""
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(EXIT_TIMEOUT)
        if process.stderr is not None:
            errors = process.stderr.read().strip()
    for stream in (process.stdin, process.stdout, process.stderr):
        if stream is not None:
            with contextlib.suppress(OSError):
                stream.close()
    return errors


def main(argv: Sequence[str] | None = None) -> int:
    """The inside forwarder: ``python -m consensus_testkit.netns PORT HOST TARGET_PORT`` forwards
    ``127.0.0.1:PORT`` to ``HOST:TARGET_PORT``, prints ``READY`` and runs until its stdin closes
    (the parent ends it, or dies)."""
    port, host, target = argv if argv is not None else sys.argv[1:]
    with TcpProxy(int(target), target_host=host, listen_port=int(port)):
        print("READY", flush=True)
        sys.stdin.read()
    return 0


if __name__ == "__main__":
    sys.exit(main())
