"""One worker of ``consensus demo``: ``CONSENSUS_URL=URL python -m consensus_api.cli.demo_worker NAME
--lifetime S``, a child of the harness (:mod:`consensus_api.children`).

It joins the group ``demo/workers``, stands for election in ``demo/scheduler``
and, while it leads, writes ``demo/config`` fenced by its leadership every
half second. It stops, closing its session, when its stdin closes (the demo
ends, or its process is gone); its watchdog ends it once its lifetime is over.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import threading
from collections.abc import Callable

from consensus_api import (
    ConsensusError,
    FencedError,
    KeyExistsError,
    KeyNotFoundError,
    LeaderChanged,
    Leadership,
    MemberExistsError,
    Storage,
    connect,
)
from consensus_api.children import Parent
from consensus_api.config import ENV_URL

GROUP = "demo/workers"
SERVICE = "demo/scheduler"
CONFIG_KEY = "demo/config"
SESSION_TIMEOUT = 2.0
WRITE_INTERVAL = 0.5


def config_prefix(name: str, term: int) -> bytes:
    """How every value leader ``name`` writes in ``term`` starts."""
    return f"leader={name} term={term} ".encode()


def config_value(name: str, term: int, count: int) -> bytes:
    """What leader ``name`` writes in its ``count``-th write."""
    return config_prefix(name, term) + f"write={count}".encode()


class Worker:
    """A demo worker's state: whether it leads, and with which term."""

    def __init__(self, name: str, stop: threading.Event) -> None:
        self.name = name
        self.stop = stop
        self._lock = threading.Lock()
        self._leadership: Leadership | None = None

    def on_leader(self, event: LeaderChanged) -> None:
        """Election listener: remember our own leadership (the fencing token)."""
        with self._lock:
            if event.leader_id == self.name and event.term is not None:
                self._leadership = Leadership(event.service, self.name, event.term)
            else:
                self._leadership = None

    def leadership(self) -> Leadership | None:
        """Our current leadership, if we lead."""
        with self._lock:
            return self._leadership

    def lost(self, leadership: Leadership) -> None:
        """A fenced write failed: that leadership is over."""
        with self._lock:
            if self._leadership == leadership:
                self._leadership = None

    def retry(self, call: Callable[[], object]) -> bool:
        """Call until it does not raise ``MemberExistsError`` (a previous run's session expiring)."""
        while not self.stop.is_set():
            try:
                call()
            except MemberExistsError:
                self.stop.wait(0.5)
            else:
                return True
        return False


def write_config(storage: Storage, value: bytes, fence: Leadership) -> None:
    """Write ``value`` to the config key, fenced by ``fence``, whether or not the key exists."""
    try:
        storage.update(CONFIG_KEY, value, fence=fence)
    except KeyNotFoundError:
        with contextlib.suppress(KeyExistsError):  # created meanwhile: the next round updates it
            storage.put(CONFIG_KEY, value, fence=fence)


def run(url: str, name: str, parent: Parent) -> int:
    """Work until ``parent`` says stop; 0 on a clean stop."""
    worker = Worker(name, parent.stop)
    with connect(url, session_timeout=SESSION_TIMEOUT) as session:
        election = session.election(SERVICE)
        election.add_listener(worker.on_leader)
        if not worker.retry(lambda: session.group(GROUP).join(name, f"pid={os.getpid()}".encode())):
            return 0
        if not worker.retry(lambda: election.nominate(name)):
            return 0
        print(f"{name}: joined {GROUP} and nominated for {SERVICE}", file=sys.stderr, flush=True)
        writes = 0
        while not worker.stop.wait(WRITE_INTERVAL):
            leadership = worker.leadership()
            if leadership is None:
                continue
            writes += 1
            try:
                write_config(session.storage, config_value(name, leadership.term, writes), leadership)
            except FencedError:
                print(f"{name}: fenced at term {leadership.term}", file=sys.stderr, flush=True)
                worker.lost(leadership)
            except ConsensusError as exc:
                print(f"{name}: write failed: {exc}", file=sys.stderr, flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``NAME --lifetime S``; the URL comes in ``$CONSENSUS_URL`` (``ps`` shows command
    lines)."""
    parser = argparse.ArgumentParser(prog="python -m consensus_api.cli.demo_worker")
    parser.add_argument("name")
    parser.add_argument("--lifetime", type=float, required=True)
    args = parser.parse_args(argv)
    url = os.environ.get(ENV_URL)
    if not url:
        parser.error(f"the URL goes in ${ENV_URL}")
    try:
        return run(url, args.name, Parent(args.lifetime))
    except ConsensusError as exc:
        print(f"{args.name}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
