"""A chaos client of the cutover workload: ``python -m consensus_chaos.record.cutover ...``.

It takes the storage client's command line and line protocol
(:mod:`consensus_chaos.record.client_process`: ``READY``, ``SESSION``, ``STOPPED``, ``DONE``,
``BYE``), connects bridged (``connect($CONSENSUS_URL, migrate_to=$CONSENSUS_MIGRATE_TO)``, members
and candidates re-joined by the session) and, until told to stop, takes random steps: a
compare-and-set increment of one of ``COUNTERS`` counters (``read``, then ``cas`` with the version
read), a step of the run's election (``nominate`` once, a ``leadership`` read, a ``write`` fenced by
the leadership it last read as its own, now and then ``resign``), or a turn at the run's lock
(``acquire``, a fenced ``write`` before and after a short hold, ``release``). Every row is of kind
``cutover``; each operation's completion says which store served it (``store``: the bridge's
authority before and after the call, null when it moved meanwhile). Terms and tokens are recorded in
``term`` (``service`` the election or the lock, ``leader`` the holder); one that does not fit a
BIGINT is an ``ok`` with ``error`` ``term out of range: N``. Leader changes (``leader``), lock losses
(``lost``) and session states (``state``) are events. The runner created the counters (``0``) and the
fenced keys before the clients started. ``consensus_chaos.check.cutover`` checks the history.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from collections.abc import Callable
from typing import Any

from consensus_api.children import Parent
from consensus_api.errors import (
    ConsensusError,
    FencedError,
    KeyExistsError,
    KeyNotFoundError,
    MemberExistsError,
    VersionConflictError,
)
from consensus_api.lock import Lease, LockLost
from consensus_api.model import LeaderChanged, Leadership
from consensus_api.session import Session
from consensus_chaos.record.client_process import Workload, add_log_level, serve
from consensus_chaos.record.journal import Journal
from consensus_chaos.record.schema import CUTOVER, EVENT, FAIL, INFO, INVOKE, OK, OUT_OF_RANGE, TOKEN_LIMIT
from consensus_chaos.record.workload import BACKOFF

#: Where the runner passes the new store's URL (the variable bridged sessions document).
ENV_MIGRATE_TO = "CONSENSUS_MIGRATE_TO"
#: How many counters the run's clients increment.
COUNTERS = 2
#: Seconds a lock holder keeps its lease between its two fenced writes (uniform).
HOLD = (0.0, 0.3)
#: The longest wait of one acquire, in session timeouts.
ACQUIRE_TIMEOUTS = 2.0
#: Errors that tell what the operation found: a definite outcome without effect.
DEFINITE = (FencedError, VersionConflictError, KeyExistsError, KeyNotFoundError, MemberExistsError)
#: Operations that change nothing: one that could not complete is a ``fail``.
READS = frozenset({"read", "leadership"})

Fields = dict[str, Any]


def counters(prefix: str) -> list[str]:
    """The run's counter keys (the runner creates them, at ``0``)."""
    return [f"{prefix}/c{index}" for index in range(COUNTERS)]


def names(prefix: str) -> tuple[str, str]:
    """The run's election service and lock."""
    return f"{prefix}/s0", f"{prefix}/l0"


def fenced_key(name: str) -> str:
    """The key written fenced by the leadership of service (or the lease of lock) ``name``."""
    return f"{name}-fenced"


def term_fields(term: int) -> Fields:
    """``term``, or the error that says it does not fit the history's int64 column."""
    return {"term": term} if 0 <= term < TOKEN_LIMIT else {"error": f"{OUT_OF_RANGE}: {term}"}


class Bridged:
    """One client process's steps on its bridged session, journaled."""

    def __init__(self, session: Session, journal: Journal, prefix: str, rng: random.Random) -> None:
        self.session = session
        self.journal = journal
        self.rng = rng
        self.counters = counters(prefix)
        self.service, self.lock_name = names(prefix)
        self.election = session.election(self.service)
        self.seq = 0
        self.incarnation = 0
        self.candidate: str | None = None
        self.fence: Leadership | None = None

    def store(self) -> str | None:
        """The store the bridge sends calls to now: ``old`` or ``new``."""
        authority: str | None = getattr(self.session._backend, "authority", None)  # the bridge's
        return authority

    def event(self, f: str, **fields: Any) -> None:
        self.journal.write({"kind": CUTOVER, "type": EVENT, "f": f, "inc": 0, **fields})

    def listen(self) -> None:
        """Record session states and the election's leader changes."""
        self.session.add_state_listener(lambda state: self.event("state", value=state.value))
        self.election.add_listener(self._on_leader)

    def _on_leader(self, change: LeaderChanged) -> None:
        fields = {} if change.term is None else term_fields(change.term)
        self.event("leader", service=change.service, leader=change.leader_id, **fields)

    def call(
        self, f: str, fields: Fields, run: Callable[[], Any], out: Callable[[Any], Fields]
    ) -> tuple[bool, Any]:
        """Journal ``run()`` as one operation: ``(True, result)``, or ``(False, None)`` unless it succeeded.
        After an unknown outcome the client backs off and continues as a new history process."""
        self.seq += 1
        base = {"kind": CUTOVER, "f": f, "seq": self.seq, "inc": self.incarnation, **fields}
        self.journal.write({**base, "type": INVOKE})
        before = self.store()
        try:
            result = run()
        except DEFINITE as exc:
            self.journal.write({**base, "type": FAIL, "error": type(exc).__name__, "store": self.store()})
            return False, None
        except ConsensusError as exc:
            read = f in READS
            self.journal.write({**base, "type": FAIL if read else INFO, "error": type(exc).__name__})
            if not read:
                self.incarnation += 1
            time.sleep(self.rng.uniform(*BACKOFF))
            return False, None
        after = self.store()
        if f == "acquire" and result is None:  # the wait ran out
            self.journal.write({**base, "type": FAIL, "error": "timeout", "store": after})
            return True, None
        self.journal.write({**base, "type": OK, "store": before if before == after else None, **out(result)})
        return True, result

    def increment(self) -> None:
        """Read a counter, then write it plus one at the version read."""
        key = self.rng.choice(self.counters)

        def shown(found: Any) -> Fields:
            return {} if found is None else {"value": found.value.decode(), "version": found.version}

        done, found = self.call("read", {"key": key}, lambda: self.session.storage.fetch(key), shown)
        if not done or found is None:
            return
        value, version = str(int(found.value) + 1), found.version
        self.call(
            "cas",
            {"key": key, "value": value, "expected_version": version},
            lambda: self.session.storage.update(key, value.encode(), version=version),
            lambda written: {"version": written},
        )

    def write(self, fence: Leadership | Lease, name: str) -> bool:
        """A fenced write of a unique value; whether it was acknowledged."""
        token, holder = (
            (fence.token, fence.holder) if isinstance(fence, Lease) else (fence.term, fence.leader_id)
        )
        key, value = fenced_key(name), f"w{self.journal.spawn}.{self.seq + 1}"
        fields = {"key": key, "value": value, "service": name, "leader": holder, **term_fields(token)}
        done, _ = self.call(
            "write",
            fields,
            lambda: self.session.storage.update(key, value.encode(), fence=fence),
            lambda v: {"version": v},
        )
        return done

    def lead(self) -> None:
        """One step of the election: nominate once, write fenced while leading, sometimes resign."""
        if self.candidate is None:
            candidate = f"c{self.journal.spawn}.{self.seq + 1}"
            done, _ = self.call(
                "nominate",
                {"service": self.service, "value": candidate},
                lambda: self.election.nominate(candidate),
                lambda leads: {"leader": candidate if leads else None},
            )
            if done:
                self.candidate = candidate
            return
        if self.fence is not None and self.rng.random() < 0.8:
            if not self.write(self.fence, self.service):
                self.fence = None  # deposed, or unknown: read the leadership again first
            return
        if self.rng.random() < 0.1:
            candidate, self.candidate, self.fence = self.candidate, None, None
            self.call(
                "resign",
                {"service": self.service, "value": candidate},
                lambda: self.election.resign(candidate),
                lambda _: {},
            )
            return

        def shown(current: Leadership | None) -> Fields:
            return {} if current is None else {"leader": current.leader_id, **term_fields(current.term)}

        done, current = self.call("leadership", {"service": self.service}, self.election.leadership, shown)
        if done and current is not None and current.leader_id == self.candidate:
            self.fence = current

    def turn(self, timeout: float) -> None:
        """Acquire the lock, write fenced by its lease, hold it a moment, write again, release it."""
        lock = self.session.lock(self.lock_name)

        def granted(lease: Lease) -> Fields:
            return {"leader": lease.holder, **term_fields(lease.token)}

        fields = {"key": self.lock_name, "service": self.lock_name, "value": "exclusive"}
        done, lease = self.call("acquire", fields, lambda: lock.acquire(timeout), granted)
        if not done or lease is None:
            return
        lock.add_listener(lambda lost: self._on_lost(lost, lease.holder))
        self.write(lease, self.lock_name)
        time.sleep(self.rng.uniform(*HOLD))
        self.write(lease, self.lock_name)
        held = {**fields, "leader": lease.holder, **term_fields(lease.token)}
        self.call("release", held, lock.release, lambda _: {})

    def _on_lost(self, lost: LockLost, holder: str) -> None:
        self.event("lost", key=lost.name, service=lost.name, leader=holder, **term_fields(lost.token))

    def step(self, acquire_timeout: float) -> None:
        roll = self.rng.random()
        if roll < 0.45:
            self.increment()
        elif roll < 0.75:
            self.lead()
        else:
            self.turn(acquire_timeout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="consensus_chaos.record.cutover")
    for name in ("--journal", "--prefix"):
        parser.add_argument(name, required=True)
    for name in ("--client", "--spawn", "--seed"):
        parser.add_argument(name, type=int, required=True)
    for name in ("--session-timeout", "--request-timeout", "--think", "--lifetime"):
        parser.add_argument(name, type=float, required=True)
    add_log_level(parser)
    args, _ = parser.parse_known_args(argv)  # the storage workload's flags do not apply

    def start(session: Session, journal: Journal) -> Workload:
        client = Bridged(session, journal, args.prefix, random.Random(args.seed))
        client.listen()

        def run(parent: Parent, deadline: float) -> None:
            while not parent.stop.is_set() and time.monotonic() < deadline:
                client.step(ACQUIRE_TIMEOUTS * args.session_timeout)
                time.sleep(client.rng.uniform(0, args.think))

        return Workload(run, lambda: None)

    return serve(args, start, extra={"migrate_to": os.environ[ENV_MIGRATE_TO]})


if __name__ == "__main__":
    sys.exit(main())
