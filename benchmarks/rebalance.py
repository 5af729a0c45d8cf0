"""Rebalance time and interruptions: eager vs cooperative vs incremental, per backend.

    python benchmarks/rebalance.py URL [--sizes 10,50,100] [--modes eager,cooperative,incremental]

For each group size N and mode, N members (coordinators spread over up to
``--sessions`` sessions in this process) share 4*N resources. Then one more
member joins, and later leaves again. For each of the two rebalances it
measures the time until every resource is owned by exactly one member and the
counts are balanced again, and how many members were interrupted (had a
resource revoked). Modes: ``eager`` (ResourceHandler, sticky assignor: every
member revokes everything), ``cooperative`` (cooperative-sticky: only what
moves, two rounds), ``incremental`` (KIP-848 reconciliation, no barrier).

Prints a table and writes ``benchmarks/results/rebalance-<backend>.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

from rich.console import Console
from rich.table import Table

import consensus_api as ca

MODES = ("eager", "cooperative", "incremental")
RESULTS = Path(__file__).with_name("results")


class Ownership:
    """Who owns what, and which members had something revoked since ``mark``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.owned: dict[str, set[str]] = {}
        self.revoked_by: set[str] = set()
        self.violations = 0

    def listener(self, member: str) -> _Listener:
        with self._lock:
            self.owned[member] = set()
        return _Listener(self, member)

    def assigned(self, member: str, resources: frozenset[str]) -> None:
        with self._lock:
            taken = {r for m, owned in self.owned.items() if m != member for r in owned}
            self.violations += len(resources & taken)
            self.owned[member] |= resources

    def revoked(self, member: str, resources: frozenset[str]) -> None:
        with self._lock:
            self.owned[member] -= resources
            self.revoked_by.add(member)

    def mark(self) -> None:
        with self._lock:
            self.revoked_by = set()

    def converged(self, members: list[str], resources: frozenset[str]) -> bool:
        with self._lock:
            held = [self.owned.get(m, set()) for m in members]
            counts = [len(h) for h in held]
            return (
                sum(counts) == len(resources)
                and set().union(*held) == resources
                and max(counts) - min(counts) <= 1
            )


@dataclass
class _Listener:
    ledger: Ownership
    member: str

    def on_assigned(self, resources: frozenset[str]) -> None:
        self.ledger.assigned(self.member, resources)

    def on_revoked(self, resources: frozenset[str]) -> None:
        self.ledger.revoked(self.member, resources)


@dataclass
class Result:
    """One rebalance: its kind (join or leave), seconds to converge and members interrupted."""

    backend: str
    mode: str
    members: int
    event: str
    seconds: float | None
    interrupted: int | None
    double_owned: int


class Group:
    """N members of one group in one mode, spread over a few sessions."""

    def __init__(self, url: str, mode: str, name: str, resources: frozenset[str], sessions: int) -> None:
        self.url, self.mode, self.name, self.resources = url, mode, name, resources
        self.sessions = [ca.connect(url, session_timeout=10, request_timeout=30) for _ in range(sessions)]
        self.ledger = Ownership()
        self.members: dict[str, ca.Coordinator | ca.IncrementalCoordinator] = {}

    def add(self, member: str) -> ca.Coordinator | ca.IncrementalCoordinator:
        session = self.sessions[len(self.members) % len(self.sessions)]
        listener = self.ledger.listener(member)
        if self.mode == "incremental":
            coordinator: ca.Coordinator | ca.IncrementalCoordinator = session.incremental_coordinator(
                self.name, self.resources, listener, assignor="sticky", rebalance_timeout=60
            )
        else:
            assignor = "sticky" if self.mode == "eager" else "cooperative-sticky"
            handler = ca.ResourceHandler(self.resources, listener, assignors=[assignor])
            coordinator = handler.join(session, self.name, rebalance_timeout=60)
        self.members[member] = coordinator
        return coordinator

    def start(self, count: int, timeout: float) -> None:
        """Add ``count`` members at once and wait until they share the resources."""
        for index in range(count):
            _activate(self.add(f"w{index:03d}"), timeout)
        self.wait(timeout)

    def wait(self, timeout: float) -> float | None:
        """Seconds until the live members share the resources, or None after ``timeout``."""
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            if self.ledger.converged(list(self.members), self.resources):
                return time.monotonic() - started
            time.sleep(0.01)
        return None

    def close(self) -> None:
        for session in self.sessions:
            session.close()


@contextmanager
def group(url: str, mode: str, size: int, sessions: int) -> Iterator[Group]:
    resources = frozenset(f"r{index:04d}" for index in range(4 * size))
    created = Group(url, mode, f"bench-{mode}-{size}-{time.time_ns()}", resources, min(size, sessions))
    try:
        yield created
    finally:
        created.close()


def measure(backend: str, members: Group, event: str, change: Callable[[], None], timeout: float) -> Result:
    members.ledger.mark()
    started = time.monotonic()
    change()
    waited = members.wait(timeout)
    seconds = None if waited is None else time.monotonic() - started
    interrupted = len(members.ledger.revoked_by - {"newcomer"})
    return Result(
        backend,
        members.mode,
        len(members.members) - (event == "join"),
        event,
        seconds,
        interrupted,
        members.ledger.violations,
    )


def _activate(coordinator: ca.Coordinator | ca.IncrementalCoordinator, timeout: float) -> None:
    """Join in the background; the measurement watches ownership, not this call."""

    def run() -> None:
        with contextlib.suppress(ca.ConsensusError):  # closed or slow: the ownership wait reports it
            coordinator.ensure_active_group(timeout)

    threading.Thread(target=run, daemon=True).start()


def _join(members: Group, timeout: float) -> None:
    _activate(members.add("newcomer"), timeout)


def _leave(members: Group) -> None:
    members.members.pop("newcomer").close()


def run(url: str, sizes: list[int], modes: list[str], sessions: int, timeout: float) -> list[Result]:
    with ca.connect(url) as probe:
        backend = probe.backend
    results: list[Result] = []
    console = Console(stderr=True)
    for size in sizes:
        for mode in modes:
            console.print(f"[dim]{backend}: {mode} with {size} members...[/dim]")
            with group(url, mode, size, sessions) as members:
                setup = time.monotonic()
                members.start(size, timeout)
                console.print(f"[dim]  set up in {time.monotonic() - setup:.1f}s[/dim]")
                results.append(measure(backend, members, "join", partial(_join, members, timeout), timeout))
                results.append(measure(backend, members, "leave", partial(_leave, members), timeout))
    return results


def show(results: list[Result]) -> None:
    table = Table(title="rebalance: one member joins a group of N, then leaves")
    for column in ("backend", "mode", "N", "event", "seconds", "interrupted", "double-owned"):
        table.add_column(column, justify="right" if column in ("N", "seconds", "interrupted") else "left")
    for r in results:
        seconds = "timeout" if r.seconds is None else f"{r.seconds:.2f}"
        table.add_row(
            r.backend, r.mode, str(r.members), r.event, seconds, str(r.interrupted), str(r.double_owned)
        )
    Console().print(table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("--sizes", default="10,50,100")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--sessions", type=int, default=10, help="sessions hosting the members (default 10)")
    parser.add_argument("--timeout", type=float, default=180.0, help="bound on each wait, in seconds")
    args = parser.parse_args(argv)
    modes = [m for m in args.modes.split(",") if m]
    if unknown := set(modes) - set(MODES):
        parser.error(f"unknown modes: {', '.join(sorted(unknown))}")
    results = run(args.url, [int(s) for s in args.sizes.split(",")], modes, args.sessions, args.timeout)
    show(results)
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"rebalance-{results[0].backend if results else 'none'}.json"
    path.write_text(json.dumps([asdict(r) for r in results], indent=2) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
