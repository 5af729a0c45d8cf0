"""The local machine, for the real test servers: loopback ports, the download cache, ``java``,
setup commands and a one-shot TCP request."""

from __future__ import annotations

import fcntl
import os
import random
import shutil
import socket
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"
_issued_ports: set[int] = set()
#: The newest ports this process handed out, with their claim files' descriptors: the ``flock``
#: tells test processes running side by side (CI's parallel suites) not to hand a port out too,
#: and goes when this process ends or the claim is among the oldest beyond ``CLAIMS_KEPT`` (a claim
#: only needs to cover the moments until a server binds its port).
_claims: dict[int, int] = {}
CLAIMS_KEPT = 256


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """Return a loopback port that was free a moment ago, never handed out before by this process,
    nor lately by another process running beside it (CI's parallel suites: see ``_claims``).

    Ports come from below the ephemeral range: a port bind(0) hands out may be taken as the local
    port of any outgoing connection before the server binds it.
    """
    high = _ephemeral_low() - 1
    claims = cache_dir() / "ports"
    claims.mkdir(parents=True, exist_ok=True)
    for _ in range(200):
        port = random.randint(min(10000, high // 2), high)
        if port in _issued_ports:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((HOST, port))
            except OSError:
                continue
        claim = _claim(claims / str(port))
        if claim is None:
            continue
        _issued_ports.add(port)
        _claims[port] = claim
        if len(_claims) > CLAIMS_KEPT:
            os.close(_claims.pop(next(iter(_claims))))
        return port
    raise RuntimeError("no free loopback port found")


def _claim(path: Path) -> int | None:
    """An open descriptor of ``path`` holding its exclusive ``flock``, or None if another process
    holds it."""
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(descriptor)
        return None
    return descriptor


def cache_dir() -> Path:
    """Where downloads and builds are kept (``consensus servers install``), and server templates:
    ``$CONSENSUS_CACHE`` or ``~/.cache/consensus-api``."""
    return Path(os.environ.get("CONSENSUS_CACHE") or Path.home() / ".cache" / "consensus-api")


def java_binary() -> str:
    """``java`` on PATH; RuntimeError naming what to install when missing."""
    java = shutil.which("java")
    if java is None:
        raise RuntimeError("java not found: install a Java 17+ runtime (Debian package default-jre-headless)")
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
