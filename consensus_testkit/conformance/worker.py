"""A child process for multi-process conformance tests, and the parent's handle on it.

Child side::

    python -m consensus_testkit.conformance.worker URL COMMAND ARGS... [--opt NAME=VALUE]... [--lifetime S]

``URL`` may be ``-`` to read it from ``$CONSENSUS_URL`` (keeps credentials off
the command line). The child talks to its parent in lines: it reads commands
on stdin and writes reports on stdout. Every wait is bounded: the child exits
on its own after ``--lifetime`` seconds or when its stdin closes.

Commands:

``put KEY``
    connect, print ``READY``, wait for ``GO``, ``put`` KEY and print
    ``RESULT won <version>``, ``RESULT exists`` or ``RESULT error <class> <message>``.
``cas KEY COUNT``
    connect, print ``READY``, wait for ``GO``, then increment the decimal
    counter in KEY COUNT times (fetch, update with version, retry on
    ``VersionConflictError``) and print ``RESULT done <conflicts>``.
``hold --group G --member M --service S --candidate C``
    connect, report every state change (``STATE <NAME>``) and every leader
    change (``LEADER <id or -> <term or ->``), join G as M, nominate C, and
    print ``READY leads|follows <term or ->``. Then serve stdin lines:
    ``FENCED_PUT KEY`` (a put fenced by the leadership held at READY:
    ``FENCED_PUT ok <version>``, ``FENCED_PUT fenced`` or
    ``FENCED_PUT error <class>``), ``FENCED put|update|delete KEY`` (the same
    write fenced by that leadership, timed: ``FENCED <op> ok|fenced|<error
    class> <seconds>``), ``PROBE_START NS``, ``PROBE_FAULT begins|ends`` and
    ``PROBE_STOP BOUND`` (a ``prober.Prober`` on keys under NS, the
    fault marked, then ``Prober.finish(BOUND)``: ``PROBED ok <calls> <longest
    seconds> <error classes or -> <calls during the fault>`` or ``PROBED
    failed <message>``, the whole message, with any traceback, on stderr) and
    ``EXIT`` (close, print ``BYE``).
``sqlite-lock --hold S [--wipe]``
    no session: open the SQLite file of URL, ``BEGIN IMMEDIATE`` (the write
    lock), with ``--wipe`` delete every row of every table (uncommitted), print
    ``READY``, hold the lock for S seconds, roll back, print ``DONE``. The
    parent may SIGKILL it while it holds the lock.
"""

from __future__ import annotations

import argparse
import os
import signal
import sqlite3
import sys
import threading
import time
from collections.abc import Mapping, Sequence

from consensus_api import (
    ConsensusError,
    FencedError,
    KeyExistsError,
    LeaderChanged,
    Leadership,
    Lease,
    SessionState,
    VersionConflictError,
    connect,
)
from consensus_api.children import Parent, say
from consensus_api.config import parse_url
from consensus_api.session import Session
from consensus_testkit.conformance.child import ChildProcess, child_parser, child_start
from consensus_testkit.conformance.helpers import EVENT_TIMEOUT
from consensus_testkit.conformance.prober import Prober
from consensus_testkit.profile import profile_for

#: Without the profile's ``stop_inside_write``: how long after a write began the process stops
#: itself (its request is then in flight), and how many writes it tries before giving up (one that
#: finished sooner is not frozen).
IN_FLIGHT = 0.0002
FREEZE_ATTEMPTS = 50


def _run_put(session: Session, parent: Parent, key: str) -> int:
    say("READY")
    if not parent.wait_for("GO"):
        say("RESULT error Timeout no GO")
        return 2
    try:
        version = session.storage.put(key, str(os.getpid()).encode())
    except KeyExistsError:
        say("RESULT exists")
    except ConsensusError as exc:
        say("RESULT error", type(exc).__name__, exc)
    else:
        say("RESULT won", version)
    return 0


def _run_cas(session: Session, parent: Parent, key: str, count: int) -> int:
    say("READY")
    if not parent.wait_for("GO"):
        say("RESULT error Timeout no GO")
        return 2
    conflicts = 0
    try:
        for _ in range(count):
            while True:
                if time.monotonic() > parent.deadline:
                    say("RESULT error Timeout increments not done")
                    return 2
                current = session.storage.fetch(key)
                if current is None:
                    say("RESULT error KeyNotFound the counter is missing")
                    return 2
                try:
                    session.storage.update(key, str(int(current.value) + 1).encode(), version=current.version)
                    break
                except VersionConflictError:
                    conflicts += 1
    except ConsensusError as exc:
        say("RESULT error", type(exc).__name__, exc)
        return 2
    say("RESULT done", conflicts)
    return 0


def _run_hold(session: Session, parent: Parent, args: argparse.Namespace) -> int:
    leading = threading.Event()

    def on_leader(event: LeaderChanged) -> None:
        say("LEADER", event.leader_id or "-", "-" if event.term is None else event.term)
        if event.leader_id == args.candidate:
            leading.set()

    def on_state(state: SessionState) -> None:
        say("STATE", state.name)

    session.add_state_listener(on_state)
    election = session.election(args.service)
    election.add_listener(on_leader)
    session.group(args.group).join(args.member, b"child")
    leads = election.nominate(args.candidate)
    held: Leadership | None = election.leadership() if leads else None
    if leads and not leading.wait(EVENT_TIMEOUT):
        say("ERROR Timeout the election listener never reported this candidate as leader")
        return 2
    say("READY", "leads" if leads else "follows", held.term if held else "-")
    prober: Prober | None = None
    while (line := parent.next()) is not None:
        command, _, argument = line.partition(" ")
        if command == "EXIT":
            break
        if command == "FENCED_PUT":
            try:
                version = session.storage.put(argument, b"fenced", fence=held)
            except FencedError:
                say("FENCED_PUT fenced")
            except ConsensusError as exc:
                say("FENCED_PUT error", type(exc).__name__)
            else:
                say("FENCED_PUT ok", version)
        elif command == "FENCED":
            _fenced_write(session, held, *argument.split(" ", 1))
        elif command == "FREEZE_IN_WRITE":
            _freeze_in_write(session, held, *argument.split(" ", 1))
        elif command == "PROBE_START" and prober is None:
            prober = Prober(session, argument, args.group, args.service).start()
        elif command == "PROBE_FAULT" and prober is not None and argument == "begins":
            prober.fault_begins()
        elif command == "PROBE_FAULT" and prober is not None and argument == "ends":
            prober.fault_ends()
        elif command == "PROBE_STOP" and prober is not None:
            say("PROBED", _stop_probing(prober, float(argument)))
            prober = None
        else:
            say("ERROR unknown command", command)
    session.close()
    say("BYE")
    return 0


def _freeze_in_write(session: Session, held: Leadership | None, operation: str, key: str) -> None:
    """A fenced write during which this process stops (SIGSTOP) until the parent resumes it.

    With the backend's ``TestProfile.stop_inside_write`` (SQL), armed here in
    this process, it stops inside the write's transaction, after its statements
    and before its commit, holding its locks. Otherwise the write runs in a
    thread and the process stops ``IN_FLIGHT`` seconds after the call began if
    it is still running (its request in flight); a write that finished sooner
    is tried again, up to ``FREEZE_ATTEMPTS`` times. Reported once resumed as
    ``FROZE <op> <outcome> <seconds>`` (``FROZE <op> never-in-flight 0`` if no
    attempt was caught).
    """
    stop_inside_write = profile_for(session.url).stop_inside_write
    if stop_inside_write is not None:
        stop_inside_write(key)
        say("FROZE", operation, *fenced_outcome(session, held, operation, key))
        return
    limit = session.settings.request_timeout + EVENT_TIMEOUT
    for _ in range(FREEZE_ATTEMPTS):
        began = threading.Event()
        ended: list[tuple[str, str]] = []
        writer = threading.Thread(
            target=_outcome_into, args=(ended, began, session, held, operation, key), daemon=True
        )
        writer.start()
        began.wait(limit)
        time.sleep(IN_FLIGHT)
        stopped = writer.is_alive()
        if stopped:
            os.kill(os.getpid(), signal.SIGSTOP)
        writer.join(limit)
        if stopped:
            say("FROZE", operation, *(ended[0] if ended else ("unfinished", "-")))
            return
    say("FROZE", operation, "never-in-flight", 0)


def _outcome_into(  # noqa: PLR0917
    ended: list[tuple[str, str]],
    began: threading.Event,
    session: Session,
    held: Leadership | None,
    operation: str,
    key: str,
) -> None:
    """``fenced_outcome`` appended to ``ended``; ``began`` is set first (a thread's target)."""
    began.set()
    ended.append(fenced_outcome(session, held, operation, key))


def _fenced_write(session: Session, held: Leadership | None, operation: str, key: str) -> None:
    say("FENCED", operation, *fenced_outcome(session, held, operation, key))


def fenced_outcome(
    session: Session,
    held: Leadership | Lease | None,
    operation: str,
    key: str,
    value: bytes = b"stale leader",
) -> tuple[str, str]:
    """A write fenced by ``held`` (a leadership or a lock lease): ``ok``, ``fenced`` or the error
    class, and the seconds it took."""
    storage = session.storage
    start = time.monotonic()
    try:
        if operation == "put":
            storage.put(key, value, fence=held)
        elif operation == "update":
            storage.update(key, value, fence=held)
        else:
            storage.delete(key, fence=held)
        outcome = "ok"
    except FencedError:
        outcome = "fenced"
    except ConsensusError as exc:
        outcome = type(exc).__name__
        print(f"fenced {operation} {key}: {outcome}: {exc}", file=sys.stderr, flush=True)
    return outcome, f"{time.monotonic() - start:.3f}"


def _stop_probing(prober: Prober, bound: float) -> str:
    try:
        prober.finish(bound)
    except AssertionError as exc:
        print(f"PROBED failed: {exc}", file=sys.stderr, flush=True)
        return f"failed {exc}"
    failures = ",".join(sorted(prober.failures())) or "-"
    return f"ok {len(prober.calls)} {prober.longest():.3f} {failures} {len(prober.during())}"


def _run_sqlite_lock(url: str, hold: float, wipe: bool) -> int:
    """Hold SQLite's write lock (optionally with every row deleted, uncommitted) for ``hold`` seconds."""
    path = parse_url(url)[0].path[1:]
    connection = sqlite3.connect(path, timeout=30, isolation_level=None)
    connection.execute("BEGIN IMMEDIATE")
    if wipe:
        tables = connection.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
        ).fetchall()
        for (table,) in tables:
            connection.execute(f'DELETE FROM "{table}"')
    say("READY")
    time.sleep(hold)
    connection.execute("ROLLBACK")
    connection.close()
    say("DONE")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser, common, commands = child_parser("consensus_testkit.conformance.worker")
    put = commands.add_parser("put", parents=[common])
    put.add_argument("key")
    cas = commands.add_parser("cas", parents=[common])
    cas.add_argument("key")
    cas.add_argument("count", type=int)
    hold = commands.add_parser("hold", parents=[common])
    for name in ("group", "member", "service", "candidate"):
        hold.add_argument(f"--{name}", required=True)
    lock = commands.add_parser("sqlite-lock", parents=[common])
    lock.add_argument("--hold", type=float, required=True)
    lock.add_argument("--wipe", action="store_true")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one worker command; the exit code is 0 when it completed."""
    args = _parser().parse_args(argv)
    parent, options = child_start(args, grace=5)
    url = os.environ.get("CONSENSUS_URL", "") if args.url == "-" else args.url
    if args.command == "sqlite-lock":
        return _run_sqlite_lock(url, args.hold, args.wipe)
    try:
        session = connect(url, **options)
    except ConsensusError as exc:
        say("ERROR", type(exc).__name__, exc)
        return 1
    try:
        if args.command == "put":
            return _run_put(session, parent, args.key)
        if args.command == "cas":
            return _run_cas(session, parent, args.key, args.count)
        return _run_hold(session, parent, args)
    except ConsensusError as exc:
        say("ERROR", type(exc).__name__, exc)
        return 1
    finally:
        session.close()


class WorkerProcess(ChildProcess):
    """The parent's handle on one child worker running ``command``."""

    def __init__(
        self,
        url: str,
        command: str,
        args: Sequence[str],
        options: Mapping[str, object],
        lifetime: float = 120.0,
        *,
        launcher: Sequence[str] = (),
    ) -> None:
        """Start the worker; ``launcher`` prefixes its command line (e.g. ``NetworkNamespace.prefix``)."""
        module = "consensus_testkit.conformance.worker"
        super().__init__(module, ["-", command, *args], url, options, lifetime, name=f"worker {command}",
                         launcher=launcher)  # fmt: skip
        self.command = command


if __name__ == "__main__":
    sys.exit(main())
