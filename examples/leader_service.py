"""A single-writer service with leader failover, the way Schema Registry does it.

    python examples/leader_service.py URL              # demo: 3 nodes, the leader is killed, failover
    python examples/leader_service.py URL --node n1    # one node, until Ctrl-C (run several)

Every node joins the coordinator group ``leader-service`` (protocol type
``sr``, protocol ``v0``) with its identity as metadata. The group's leader
picks the eligible node with the smallest URL and gives every node the same
assignment: who the writer is. Only the writer appends to the shared log
(``leader-service/log``): it re-reads the log before each write and writes
with a compare-and-set on the version it read, and only while its
generation is stable (``generation_if_stable``): during a rebalance nobody
writes (``on_join_prepare`` clears the writer). When the writer dies, its
session expires, the group rebalances and the next node takes over.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping

import consensus_api as ca

GROUP = "leader-service"
LOG_KEY = "leader-service/log"


class Node:
    """One service node: a CoordinatorHandler whose assignment names the writer."""

    def __init__(self, session: ca.Session, name: str) -> None:
        self.name = name
        self.identity = {"name": name, "url": f"http://{name}:8081", "eligible": True}
        self.session = session
        self.coordinator = session.coordinator(GROUP, "sr", self, rebalance_timeout=10)
        self._writer: tuple[int, str] | None = None  # (generation, writer's name) while stable

    # CoordinatorHandler (on the coordinator thread)

    def metadata(self) -> list[tuple[str, bytes]]:
        return [("v0", json.dumps(self.identity).encode())]

    def on_join_prepare(self, generation: int, member_id: str) -> None:
        self._writer = None  # nobody writes during a rebalance

    def perform_assignment(
        self, leader_id: str, protocol: str, members: Mapping[str, bytes]
    ) -> dict[str, bytes]:
        identities = {member: json.loads(raw) for member, raw in members.items()}
        eligible = sorted((i["url"], i["name"]) for i in identities.values() if i["eligible"])
        writer = eligible[0][1] if eligible else None
        assignment = json.dumps({"writer": writer}).encode()
        return dict.fromkeys(members, assignment)

    def on_join_complete(self, generation: int, member_id: str, protocol: str, assignment: bytes) -> None:
        writer = json.loads(assignment)["writer"]
        self._writer = (generation, writer)
        role = "I write" if writer == self.name else f"{writer} writes"
        say(self.name, f"generation {generation}: {role}")

    def on_leave_prepare(self) -> None:
        self._writer = None

    # The service

    def writes(self) -> bool:
        """True while this node is the writer of the current, stable generation."""
        stable, writer = self.coordinator.generation_if_stable(), self._writer
        return stable is not None and writer is not None and writer == (stable.generation_id, self.name)

    def append(self, entry: str) -> int | None:
        """Append ``entry`` to the log if this node is the writer; the new length, or None."""
        if not self.writes():
            return None
        storage = self.session.storage
        current = storage.fetch(LOG_KEY)  # read to the end before writing
        entries = json.loads(current.value) if current else []
        entries.append({"by": self.name, "entry": entry})
        try:
            if current is None:
                storage.put(LOG_KEY, json.dumps(entries).encode())
            else:
                storage.update(LOG_KEY, json.dumps(entries).encode(), version=current.version)
        except (ca.VersionConflictError, ca.KeyExistsError):
            say(self.name, "someone else wrote first; not the writer any more?")
            return None
        return len(entries)


def say(name: str, text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {name}: {text}", flush=True)


def run_node(url: str, name: str, duration: float) -> int:
    """One node: join, then append an entry every second while it is the writer."""
    with ca.connect(url, session_timeout=3) as session:
        node = Node(session, name)
        node.coordinator.ensure_active_group(30)
        deadline, count = time.monotonic() + duration, 0
        while time.monotonic() < deadline:
            count += 1
            length = node.append(f"{name}-{count}")
            if length is not None:
                say(name, f"appended entry {length}")
            time.sleep(1.0)
    return 0


def run_demo(url: str) -> int:
    """Three node processes; the writer is SIGKILLed; another node takes over."""
    nodes = {name: _spawn(url, name) for name in ("n1", "n2", "n3")}
    lines: list[str] = []
    relays = [threading.Thread(target=_relay, args=(proc, lines), daemon=True) for proc in nodes.values()]
    for relay in relays:
        relay.start()
    try:
        first = _wait_for(lines, lambda line: "appended entry" in line, 60)
        writer = first.split("] ", 1)[1].split(":", 1)[0]
        time.sleep(3)
        say("demo", f"killing the writer {writer} (SIGKILL)")
        nodes[writer].send_signal(signal.SIGKILL)
        killed = len(lines)
        second = _wait_for(
            lines, lambda line: "appended entry" in line and f"{writer}:" not in line, 60, killed
        )
        say("demo", f"failover done: {second.split('] ', 1)[1].split(':', 1)[0]} writes now")
        time.sleep(2)
    finally:
        for proc in nodes.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in nodes.values():
            proc.wait(15)
    with ca.connect(url) as session:
        stored = session.storage.fetch(LOG_KEY)
        entries = json.loads(stored.value) if stored else []
    writers = [entry["by"] for entry in entries]
    say("demo", f"the log holds {len(entries)} entries, written by {' then '.join(_runs(writers))}")
    return 0


def _spawn(url: str, name: str) -> subprocess.Popen[str]:
    command = [sys.executable, __file__, "-", "--node", name, "--duration", "60"]
    return subprocess.Popen(
        command, stdout=subprocess.PIPE, text=True, env={**os.environ, "CONSENSUS_URL": url}
    )


def _relay(proc: subprocess.Popen[str], lines: list[str]) -> None:
    assert proc.stdout is not None
    for line in proc.stdout:
        print(line, end="", flush=True)
        lines.append(line.strip())


def _wait_for(lines: list[str], match: Callable[[str], bool], timeout: float, since: int = 0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [line for line in lines[since:] if match(line)]
        if found:
            return found[0]
        time.sleep(0.1)
    raise SystemExit(f"timed out after {timeout:.0f}s")


def _runs(items: list[str]) -> list[str]:
    runs: list[str] = []
    for item in items:
        if not runs or runs[-1] != item:
            runs.append(item)
    return runs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", help="backend URL ('-' for $CONSENSUS_URL)")
    parser.add_argument("--node", help="run one node with this name instead of the demo")
    parser.add_argument("--duration", type=float, default=3600.0, help="seconds a node runs")
    args = parser.parse_args()
    url = os.environ["CONSENSUS_URL"] if args.url == "-" else args.url
    return run_node(url, args.node, args.duration) if args.node else run_demo(url)


if __name__ == "__main__":
    sys.exit(main())
