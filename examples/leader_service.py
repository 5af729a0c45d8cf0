"""A single-writer service with leader failover, the way Schema Registry does it.

    python examples/leader_service.py URL              # demo: 3 nodes, the writer is killed, failover
    python examples/leader_service.py URL --node n1    # one node, until Ctrl-C (run several)

Every node joins the coordinator group ``leader-service`` (protocol type
``sr``, protocol ``v0``) with its identity as metadata. The group's leader
picks the eligible node with the smallest URL and gives every node the same
assignment: who the writer is. Only the writer appends to the shared log
(``leader-service/log``), and only while its generation is stable
(``generation_if_stable``): during a rebalance nobody writes
(``on_join_prepare`` clears the writer). Each write is fenced: the writer
holds the lock ``leader-service/writer`` and writes with ``fence=`` its lease
(re-reading the log first and writing with a compare-and-set on the version
it read), so a writer that lost its place without noticing (paused, cut off)
cannot write once the next one holds the lock; every entry records its
writer's token, which only grows. When the writer dies, its session expires,
its lease ends, the group rebalances and the next writer takes the lock with a
greater token.
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
WRITER_LOCK = "leader-service/writer"
NODES = ("n1", "n2", "n3")


class Node:
    """One service node: a CoordinatorHandler whose assignment names the writer."""

    def __init__(self, session: ca.Session, name: str) -> None:
        self.name = name
        self.identity = {"name": name, "url": f"http://{name}:8081", "eligible": True}
        self.session = session
        self.coordinator = session.coordinator(GROUP, "sr", self, rebalance_timeout=10)
        self.writer_lock = session.lock(WRITER_LOCK)
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
        """Append ``entry`` to the log if this node is the writer and holds the writer lock (waiting at
        most a second for the previous writer's lease to end); the new length, or None."""
        if not self.writes():
            if self.writer_lock.held:
                self.writer_lock.release()  # the next writer takes over
            return None
        try:
            lease = self.writer_lock.lease or self.writer_lock.acquire(timeout=1.0)
        except ca.SessionLostError:
            return None  # the session was lost meanwhile: so is the writer's place
        if lease is None:
            return None  # the previous writer's lease has not ended yet
        storage = self.session.storage
        current = storage.fetch(LOG_KEY)  # read to the end before writing
        entries = json.loads(current.value) if current else []
        entries.append({"by": self.name, "entry": entry, "token": lease.token})
        try:
            if current is None:
                storage.put(LOG_KEY, json.dumps(entries).encode(), fence=lease)
            else:
                storage.update(LOG_KEY, json.dumps(entries).encode(), version=current.version, fence=lease)
        except ca.FencedError:
            say(self.name, f"fenced: my lease (token {lease.token}) is not the writer's any more")
            return None
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
            lease = node.writer_lock.lease
            if length is not None and lease is not None:
                say(name, f"appended entry {length} (token {lease.token})")
            time.sleep(1.0)
    return 0


def run_demo(url: str) -> int:
    """Three node processes; once they agree on the writer, it is SIGKILLed; another node takes the
    writer lock with a greater token and goes on appending."""
    nodes = {name: _spawn(url, name) for name in NODES}
    lines: list[str] = []
    relays = [threading.Thread(target=_relay, args=(proc, lines), daemon=True) for proc in nodes.values()]
    for relay in relays:
        relay.start()
    try:
        writer = _wait_for_agreed_writer(lines, 60)
        agreed = len(lines)
        appended = _wait_for(lines, lambda line: line.startswith(f"{writer}: appended entry"), 60, agreed)
        say("demo", f"killing the writer {writer} (SIGKILL), which holds token {_token(appended)}")
        nodes[writer].send_signal(signal.SIGKILL)
        killed = len(lines)
        taken = _wait_for(
            lines, lambda line: "appended entry" in line and not line.startswith(writer), 60, killed
        )
        successor = taken.split(":", 1)[0]
        say(
            "demo",
            f"fenced hand-over: {writer} (token {_token(appended)}) -> {successor} (token {_token(taken)})",
        )
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
    tenures = _runs([f"{entry['by']} (token {entry['token']})" for entry in entries])
    say("demo", f"the log holds {len(entries)} entries, written by {' then '.join(tenures)}")
    tokens = [entry["token"] for entry in entries]
    if tokens != sorted(tokens):
        say("demo", "FAILED: an entry was written with an older token than one before it")
        return 1
    return 0


def _wait_for_agreed_writer(lines: list[str], timeout: float) -> str:
    """The writer once every node's latest generation is the same one, naming the same writer."""

    def agreed() -> str | None:
        latest: dict[str, tuple[int, str]] = {}
        for line in lines:
            node, _, text = line.partition(": ")
            if text.startswith("generation "):
                generation, _, role = text.removeprefix("generation ").partition(": ")
                latest[node] = (int(generation), node if role == "I write" else role.split()[0])
        views = set(latest.values())
        return views.pop()[1] if len(latest) == len(NODES) and len(views) == 1 else None

    deadline = time.monotonic() + timeout
    while (writer := agreed()) is None:
        if time.monotonic() > deadline:
            raise SystemExit(f"the nodes did not agree on a writer within {timeout:.0f}s")
        time.sleep(0.1)
    return writer


def _token(line: str) -> int:
    return int(line.rpartition("(token ")[2].rstrip(")"))


def _spawn(url: str, name: str) -> subprocess.Popen[str]:
    command = [sys.executable, __file__, "-", "--node", name, "--duration", "60"]
    return subprocess.Popen(
        command, stdout=subprocess.PIPE, text=True, env={**os.environ, "CONSENSUS_URL": url}
    )


def _relay(proc: subprocess.Popen[str], lines: list[str]) -> None:
    """Print each line of a node, and keep it without its timestamp (``"n1: text"``)."""
    assert proc.stdout is not None
    for line in proc.stdout:
        print(line, end="", flush=True)
        lines.append(line.strip().partition("] ")[2])


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
