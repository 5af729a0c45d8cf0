"""A chaos client process: ``python -m consensus_chaos.record.client_process --journal PATH ...``.

The URL comes from ``$CONSENSUS_URL`` (credentials stay off the command line).
The process talks to the runner in lines (the child harness,
:mod:`consensus_api.children`). It prints ``READY`` once connected
and listening, ``SESSION <JSON>`` whenever its session is (re-)established
(what names it on the server, ``Backend.fault_identity``, for a real
server-side expiry), ``STOPPED`` after ``STOP`` on stdin
(the workload has ended), ``DONE`` after ``FINAL`` (it waits until its
listeners have been quiet for ``QUIET`` seconds, at most ``SETTLE_MAX``,
reads each watched object directly and records that read as a ``final``
marker), and ``BYE`` after ``EXIT``, once its session is closed. The runner
sends ``EXIT`` only when every client is ``DONE``: closing a session changes
memberships and leaderships others are still reading. Every wait is
bounded: the process exits by itself after ``--lifetime`` seconds or when
stdin closes, and its watchdog ends it at the latest 5 s after either. The
library logs from INFO up (``--log-level``) to stderr, which the runner keeps
beside the history as ``<run>.log``, each line stamped with the journal's
clock (``time.monotonic_ns``) so that it reads against the history.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from consensus_api.children import Parent, say
from consensus_api.config import ENV_URL
from consensus_api.errors import BackendUnavailableError, ConfigurationError, ConsensusError
from consensus_api.model import SessionState
from consensus_api.session import Session, connect
from consensus_chaos.record.journal import Journal
from consensus_chaos.record.schema import ELECTION, FINAL, GROUP, KV
from consensus_chaos.record.workload import QUIET, SETTLE_MAX, Plan, Worker, text

RETRY = 0.2
#: The levels a client's log may start at (``--log-level``).
LOG_LEVELS = ("DEBUG", "INFO", "WARNING")


def report_session(session: Session) -> None:
    """Tell the runner what names ``session`` on the server now (``Backend.fault_identity``)."""
    identity = session._backend.fault_identity()  # the SPI's test-only hook
    say("SESSION", json.dumps(identity, separators=(",", ":")))


class _JournalClock(logging.Formatter):
    """Stamps a record with the journal's clock, then names its thread, logger and level."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = f"{time.monotonic_ns()} {record.threadName} {record.name} {record.levelname}"
        return f"{stamp}: {super().format(record)}"


def log_to_stderr(level: str) -> None:
    """The library's records from ``level`` up to stderr, stamped with the journal's clock; at
    ``DEBUG`` the client libraries' (kafka-python, kazoo, ...) records from INFO up as well."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_JournalClock())
    library = logging.getLogger("consensus_api")
    library.setLevel(level)
    if level == "DEBUG":
        everything = logging.getLogger()
        everything.setLevel(logging.INFO)
        everything.addHandler(handler)
    else:
        library.addHandler(handler)


def add_log_level(parser: argparse.ArgumentParser) -> None:
    """The ``--log-level`` flag every chaos client takes (see :func:`log_to_stderr`)."""
    parser.add_argument("--log-level", choices=LOG_LEVELS, default="INFO")


def open_session(url: str, options: dict[str, Any], parent: Parent) -> Session | None:
    """Connect, retrying while the backend is unreachable; None if stopped or out of time first."""
    while not parent.stop.is_set() and time.monotonic() < parent.deadline:
        try:
            return connect(url, **options)
        except BackendUnavailableError:
            time.sleep(RETRY)
    return None


def settle_and_record(worker: Worker) -> None:
    """Wait for quiet listeners, then read each watched object and record it as a ``final`` marker."""
    limit = time.monotonic() + SETTLE_MAX
    while time.monotonic() < limit and time.monotonic_ns() - worker.last_event_ns < QUIET * 1e9:
        time.sleep(0.05)
    for key in sorted(worker.watched):
        done, found = worker.fetch(key)
        if done:
            value = (text(found.value), found.version) if found is not None else (None, None)
            worker.event(KV, FINAL, key=key, value=value[0], version=value[1])
    done, current = worker.read_leadership()
    if done:
        fields = {} if current is None else {"leader": current.leader_id, "term": current.term}
        worker.event(ELECTION, FINAL, service=worker.plan.service, **fields)
    done, members = worker.read_members()
    if done:
        worker.event(GROUP, FINAL, key=worker.plan.group, members=sorted(members))


@dataclass(frozen=True)
class Workload:
    """What a chaos client does with its session: ``run(parent, deadline)`` until told to stop (or
    out of time), then ``final()`` records its final markers."""

    run: Callable[[Parent, float], None]
    final: Callable[[], None]


def serve(
    args: argparse.Namespace,
    start: Callable[[Session, Journal], Workload],
    *,
    auto_rejoin: bool = True,
    extra: Mapping[str, Any] | None = None,
) -> int:
    """A chaos client's life, the same for every workload: open the session (``extra`` added to the
    connect options; exit 2 for a bad configuration), journal, tell the runner the session at each
    CONNECTED; ``start`` sets the workload up, then ``READY``, the workload, ``STOPPED``, on
    ``FINAL`` its final markers and ``DONE``, on ``EXIT`` ``BYE``. A ``ConsensusError`` ends the
    workload early; the session is always closed."""
    parent = Parent(args.lifetime, stop_words=("STOP", "EXIT"))
    log_to_stderr(args.log_level)
    options: dict[str, Any] = {
        "session_timeout": args.session_timeout,
        "request_timeout": args.request_timeout,
        "connect_timeout": max(args.request_timeout, 2.0),
        "auto_rejoin": auto_rejoin,
        **(extra or {}),
    }
    try:
        session = open_session(os.environ[ENV_URL], options, parent)
    except ConfigurationError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if session is None:
        say("STOPPED")
        return 0
    journal = Journal(Path(args.journal), args.spawn, args.client)

    def on_state(state: SessionState) -> None:
        if state is SessionState.CONNECTED:
            report_session(session)

    session.add_state_listener(on_state)
    report_session(session)
    try:
        workload = start(session, journal)
        say("READY")
        workload.run(parent, parent.deadline)
        say("STOPPED")
        if parent.wait_for("FINAL", abort_on=("EXIT",)):
            workload.final()
            say("DONE")
            parent.wait_for("EXIT")
    except ConsensusError as exc:
        print(f"client stopped: {type(exc).__name__}: {exc}", file=sys.stderr)
    finally:
        session.close()
        journal.close()
    say("BYE")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="consensus_chaos.record.client_process")
    for name in ("--journal", "--prefix"):
        parser.add_argument(name, required=True)
    for name in ("--client", "--clients", "--keys", "--spawn", "--t0-ns", "--seed"):
        parser.add_argument(name, type=int, required=True)
    for name in ("--key-period", "--session-timeout", "--request-timeout", "--think", "--lifetime"):
        parser.add_argument(name, type=float, required=True)
    add_log_level(parser)
    args = parser.parse_args(argv)
    plan = Plan(args.prefix, args.clients, args.keys, int(args.key_period * 1e9), args.t0_ns, args.client)

    def start(session: Session, journal: Journal) -> Workload:
        worker = Worker(session, journal, plan, random.Random(args.seed))
        worker.start_listening()

        def run(parent: Parent, deadline: float) -> None:
            while not parent.stop.is_set() and time.monotonic() < deadline:
                try:
                    worker.step()
                except ConsensusError as exc:  # a listener could not be moved; operations never raise
                    print(f"step failed: {type(exc).__name__}: {exc}", file=sys.stderr)
                    time.sleep(RETRY)
                time.sleep(worker.rng.uniform(0, args.think))

        return Workload(run, lambda: settle_and_record(worker))

    return serve(args, start, auto_rejoin=False)


if __name__ == "__main__":
    sys.exit(main())
