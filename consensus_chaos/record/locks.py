"""A chaos client of the locks workload: ``python -m consensus_chaos.record.locks ...``.

It takes the storage client's command line and line protocol
(:mod:`consensus_chaos.record.client_process`: ``READY``, ``SESSION``, ``STOPPED``,
``DONE``, ``BYE``) and, instead of storage operations, takes turns at
``LOCKS`` fenced locks of the run: it acquires one (shared one time in
``SHARED_SHARE``), holds it briefly and releases it. It journals, as ``lock``
rows (``key`` the lock): ``acquire`` operations (``value`` ``exclusive`` or
``shared``; ``ok`` with ``term`` the token and ``leader`` the holder id,
``fail`` with error ``timeout``), ``release`` operations (``leader``, ``term``)
and ``lost`` events (``leader`` and ``term`` of the lease, at the moment the
holder was told: a ``LockLost``, or the session's ``LOST`` state when it comes
only after the release of its latest lease). ``consensus_chaos.check.locks`` checks
them. Like the storage client, it continues under a new history process after
an operation with an unknown outcome.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable
from typing import Any

from consensus_api.children import Parent
from consensus_api.errors import ConsensusError
from consensus_api.lock import Lease, LockLost
from consensus_api.model import SessionState
from consensus_api.session import Session
from consensus_chaos.record.client_process import Workload, add_log_level, serve
from consensus_chaos.record.journal import Journal
from consensus_chaos.record.schema import EVENT, FAIL, INFO, INVOKE, LOCK, OK
from consensus_chaos.record.workload import BACKOFF

#: How many locks the run's clients share.
LOCKS = 2
#: The share of acquires that ask for a shared lease.
SHARED_SHARE = 0.25
#: Seconds a holder keeps its lease (uniform).
HOLD = (0.0, 0.2)
#: The longest wait of one acquire, in session timeouts.
ACQUIRE_TIMEOUTS = 2.0


class Locker:
    """One client process's turns at the run's locks, journaled."""

    def __init__(self, session: Session, journal: Journal, prefix: str, rng: random.Random) -> None:
        self.session = session
        self.journal = journal
        self.rng = rng
        self.names = [f"{prefix}/l{index}" for index in range(LOCKS)]
        self.seq = 0
        self.incarnation = 0
        #: The latest lease of this session: (lock, token, holder); reported lost with the session.
        self.latest: tuple[str, int, str] | None = None

    def _call(self, f: str, fields: dict[str, Any], run: Callable[[], Any]) -> tuple[bool, Any]:
        """Journal ``run()`` as one operation: ``(True, result)``, or ``(False, None)`` if it raised
        (an unknown outcome: the client continues as a new process after a back-off)."""
        self.seq += 1
        base = {"kind": LOCK, "f": f, "seq": self.seq, "inc": self.incarnation, **fields}
        self.journal.write({**base, "type": INVOKE})
        try:
            result = run()
        except ConsensusError as exc:
            self.journal.write({**base, "type": INFO, "error": type(exc).__name__})
            self.incarnation += 1
            time.sleep(self.rng.uniform(*BACKOFF))
            return False, None
        if f == "acquire" and result is None:
            self.journal.write({**base, "type": FAIL, "error": "timeout"})
        else:
            done = {"leader": result.holder, "term": result.token} if isinstance(result, Lease) else {}
            self.journal.write({**base, "type": OK, **done})
        return True, result

    def _on_lost(self, lost: LockLost, holder: str) -> None:
        self.journal.write(
            {"kind": LOCK, "type": EVENT, "f": "lost", "inc": 0, "key": lost.name, "term": lost.token}
            | {"leader": holder}
        )

    def on_state(self, state: SessionState) -> None:
        """A lost session ends its latest lease too, if its holder let go before it was told."""
        latest = self.latest
        if state is SessionState.LOST and latest is not None:
            self.latest = None
            self._on_lost(LockLost(latest[0], latest[1]), latest[2])

    def turn(self, timeout: float) -> None:
        """Acquire one lock, hold it for a moment, release it."""
        name = self.rng.choice(self.names)
        shared = self.rng.random() < SHARED_SHARE
        lock = self.session.lock(name, shared=shared)
        mode = "shared" if shared else "exclusive"
        done, lease = self._call("acquire", {"key": name, "value": mode}, lambda: lock.acquire(timeout))
        if not done or lease is None:
            return
        self.latest = (name, lease.token, lease.holder)
        lock.add_listener(lambda lost: self._on_lost(lost, lease.holder))
        if lock.lease is None:  # lost between the acquire and the listener: LockLost was not seen
            self._on_lost(LockLost(name, lease.token), lease.holder)
        time.sleep(self.rng.uniform(*HOLD))
        held = {"key": name, "value": mode, "leader": lease.holder, "term": lease.token}
        self._call("release", held, lock.release)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="consensus_chaos.record.locks")
    for name in ("--journal", "--prefix"):
        parser.add_argument(name, required=True)
    for name in ("--client", "--spawn", "--seed"):
        parser.add_argument(name, type=int, required=True)
    for name in ("--session-timeout", "--request-timeout", "--lifetime"):
        parser.add_argument(name, type=float, required=True)
    add_log_level(parser)
    args, _ = parser.parse_known_args(argv)  # the storage workload's flags do not apply

    def start(session: Session, journal: Journal) -> Workload:
        locker = Locker(session, journal, f"{args.prefix}/locks", random.Random(args.seed))
        session.add_state_listener(locker.on_state)

        def run(parent: Parent, deadline: float) -> None:
            while not parent.stop.is_set() and time.monotonic() < deadline:
                locker.turn(ACQUIRE_TIMEOUTS * args.session_timeout)

        return Workload(run, lambda: None)

    return serve(args, start)


if __name__ == "__main__":
    sys.exit(main())
