"""A child process holding or contending for a lock, for the ``locks`` section, and its parent's handle.

Child side::

    python -m consensus_testkit.conformance.lock_worker URL COMMAND ARGS... \
        [--opt NAME=VALUE]... [--lifetime S]

``URL`` may be ``-`` to read it from ``$CONSENSUS_URL``. Reports are lines on
stdout, commands lines on stdin; the child exits on its own after
``--lifetime`` seconds. Commands:

``hold NAME [--shared]``
    connect, report every state change (``STATE <NAME>``) and a lost lease
    (``LOST <token>``), acquire the lock and print ``HELD <token>``. Then serve
    ``FENCED put|update|delete KEY`` (the write fenced by the lease held:
    ``FENCED <op> ok|fenced|<error class> <seconds>``), ``RELEASE``
    (``RELEASED``) and ``EXIT``.
``contend NAME KEY THREADS ROUNDS``
    connect, print ``READY``, wait for ``GO``; then THREADS threads each
    acquire the lock ROUNDS times and, holding it, increment the decimal
    counter in KEY (fetch, then a fenced update without a version: a lost
    update shows a second holder). Each tenure is reported as ``HELD <token>
    <start> <end>`` (``time.monotonic()`` at acquired and before release,
    system-wide on Linux); then ``DONE``, or ``ERROR <class> <message>``.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from collections.abc import Mapping, Sequence

from consensus_api import ConsensusError, Lease, LockLost, SessionState, connect
from consensus_api.children import Parent, say
from consensus_api.session import Session
from consensus_testkit.conformance.child import ChildProcess, child_parser, child_start
from consensus_testkit.conformance.helpers import EVENT_TIMEOUT
from consensus_testkit.conformance.worker import fenced_outcome


def _fenced(session: Session, lease: Lease, operation: str, key: str) -> None:
    say("FENCED", operation, *fenced_outcome(session, lease, operation, key, b"stale holder"))


def _run_hold(session: Session, parent: Parent, name: str, shared: bool) -> int:
    def on_state(state: SessionState) -> None:
        say("STATE", state.name)

    def on_lost(event: LockLost) -> None:
        say("LOST", event.token)

    session.add_state_listener(on_state)
    lock = session.lock(name, shared=shared)
    lock.add_listener(on_lost)
    lease = lock.acquire(timeout=EVENT_TIMEOUT)
    if lease is None:
        say("ERROR Timeout the lock was not acquired")
        return 2
    say("HELD", lease.token)
    while (line := parent.next()) is not None:
        command, _, argument = line.partition(" ")
        if command == "EXIT":
            break
        if command == "FENCED":
            _fenced(session, lease, *argument.split(" ", 1))
        elif command == "RELEASE":
            lock.release()
            say("RELEASED")
        else:
            say("ERROR unknown command", command)
    return 0


def _contend(session: Session, name: str, key: str, rounds: int, failures: list[str]) -> None:
    lock = session.lock(name)
    storage = session.storage
    limit = 4 * EVENT_TIMEOUT
    try:
        for _ in range(rounds):
            lease = lock.acquire(timeout=limit)
            if lease is None:
                failures.append(f"Timeout the lock was not acquired within {limit}s")
                return
            start = time.monotonic()
            try:
                current = storage.fetch(key)
                count = int(current.value) if current is not None else 0
                storage.update(key, str(count + 1).encode(), fence=lease)
                end = time.monotonic()
            finally:
                lock.release()
            say("HELD", lease.token, f"{start:.6f}", f"{end:.6f}")
    except ConsensusError as exc:
        failures.append(f"{type(exc).__name__} {exc}")


def _run_contend(session: Session, parent: Parent, args: argparse.Namespace) -> int:
    say("READY")
    if not parent.wait_for("GO"):
        say("ERROR no GO")
        return 2
    failures: list[str] = []
    workers = [
        threading.Thread(
            target=_contend,
            args=(session, args.name, args.key, args.rounds, failures),
            name=f"contender-{index}",
        )
        for index in range(args.threads)
    ]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    if failures:
        say("ERROR", failures[0])
        return 2
    say("DONE")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser, common, commands = child_parser("consensus_testkit.conformance.lock_worker")
    hold = commands.add_parser("hold", parents=[common])
    hold.add_argument("name")
    hold.add_argument("--shared", action="store_true")
    contend = commands.add_parser("contend", parents=[common])
    contend.add_argument("name")
    contend.add_argument("key")
    contend.add_argument("threads", type=int)
    contend.add_argument("rounds", type=int)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; the exit code is 0 when it completed."""
    args = _parser().parse_args(argv)
    parent, options = child_start(args)
    url = os.environ.get("CONSENSUS_URL", "") if args.url == "-" else args.url
    try:
        session: Session = connect(url, **options)
    except ConsensusError as exc:
        say("ERROR", type(exc).__name__, exc)
        return 1
    try:
        if args.command == "hold":
            return _run_hold(session, parent, args.name, args.shared)
        return _run_contend(session, parent, args)
    except ConsensusError as exc:
        say("ERROR", type(exc).__name__, exc)
        return 1
    finally:
        session.close()


class LockWorker(ChildProcess):
    """The parent's handle on one lock worker."""

    def __init__(
        self, url: str, args: Sequence[str], options: Mapping[str, object], lifetime: float = 120.0
    ) -> None:
        super().__init__("consensus_testkit.conformance.lock_worker", ["-", *args], url, options, lifetime,
                         name=f"lock worker {args[0]}")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
