"""Fenced locks, exclusive and shared, built on one election queue per lock.

Contract: <https://consensus-api.github.io/consensus-api/spec/#7a-locks>

The recipe (kazoo's ``Lock`` / ``ReadLock`` / ``WriteLock``, on this API's own
primitives): every acquire queues a fresh candidate in the lock's election
``_consensus/locks/<name>``, and the queue serves candidates in arrival order.
An exclusive holder is the candidate leading that queue once no shared holder
is left; a shared acquirer, once first in line, joins the lock's group of
shared holders (same name) and steps out of the queue, letting the next one in.
A lease's token is the term at which its holder reached the head of the queue.

Guarantees, on every backend:

* **Mutual exclusion.** While its holder's session is alive, an exclusive
  lease excludes every other lease of the lock; shared leases exclude only
  exclusive ones. A lock lives exactly as long as its holder's session: a
  holder whose session is lost loses the lock (it is told: ``LockLost`` to the
  lock's listeners), and the next waiter may take it within ``session_timeout``
  plus the backend's detection delay.
* **Fencing.** Tokens strictly increase per lock across holders, in the order
  they acquired it. A ``Storage`` write with ``fence=`` an exclusive lease
  happens only while that lease is the lock's current one (checked atomically
  with the write, else ``FencedError``): a holder that was paused past its
  session's expiry cannot overwrite what a later holder wrote.
* **Fairness.** Waiters are served in arrival order; a shared waiter behind an
  exclusive waiter waits for it.
* Bad input (names, timeouts, fences, releasing a lock not held) is refused
  before any I/O; every wait is bounded by ``timeout``.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from consensus_api._session_port import SessionPort
from consensus_api.backend import Target, TargetKind
from consensus_api.errors import (
    ConsensusError,
    InvalidKeyError,
    InvalidTypeError,
    MemberExistsError,
    NotAMemberError,
    SessionLostError,
)
from consensus_api.keys import check_key, join_key
from consensus_api.model import Leadership, SessionState

log = logging.getLogger("consensus_api")

#: Where locks live: each lock's queue (an election) and its shared holders (a group).
LOCKS_NAMESPACE = "_consensus/locks"
#: The longest wait between two reads of the queue when no change is reported.
RECHECK_INTERVAL = 0.5


@dataclass(frozen=True, slots=True)
class Lease:
    """One holder's tenure of lock ``name``; ``token`` is its fencing token."""

    name: str
    token: int
    shared: bool
    holder: str


@dataclass(frozen=True, slots=True)
class LockLost:
    """The lease of lock ``name`` with ``token`` ended with its holder's session."""

    name: str
    token: int


def lock_service(name: str) -> str:
    """The election (queue) and group (shared holders) of lock ``name``; checked."""
    check_key(name, "lock name")
    return check_key(join_key(LOCKS_NAMESPACE, name), "lock name")


def lease_fence(lease: Lease) -> Leadership:
    """The leadership an exclusive lease stands for; ``InvalidTypeError`` for a shared one."""
    if lease.shared:
        raise InvalidTypeError(
            f"a shared lease of lock {lease.name!r} cannot fence a write: its holders are not exclusive"
        )
    return Leadership(lock_service(lease.name), lease.holder, lease.token)


def check_timeout(timeout: Any, blocking: Any) -> float | None:
    """The longest wait in seconds (None: no limit) for ``acquire(timeout, blocking)``."""
    if not isinstance(blocking, bool):
        raise InvalidTypeError(f"blocking must be bool, not {type(blocking).__name__}")
    if timeout is None:
        return None if blocking else 0.0
    if not isinstance(timeout, int | float) or isinstance(timeout, bool):
        raise InvalidTypeError(f"timeout must be a number or None, not {type(timeout).__name__}")
    if not timeout >= 0:
        raise InvalidKeyError(f"timeout must be a non-negative number of seconds, got {timeout}")
    return float(timeout) if blocking else 0.0


class Lock:
    """A fenced lock; one ``Lock`` object holds at most one lease at a time. Thread-safe.

    ``acquire`` returns a ``Lease`` (pass it as ``fence=`` to ``Storage``
    writes) or None when it timed out; ``release`` gives the lease back. As a
    context manager it acquires without a time limit and releases on exit.
    """

    def __init__(self, session: SessionPort, name: str, *, shared: bool = False) -> None:
        if not isinstance(shared, bool):
            raise InvalidTypeError(f"shared must be bool, not {type(shared).__name__}")
        self._session = session
        self._service = lock_service(name)
        self.name = name
        self.shared = shared
        self._mutex = threading.Lock()
        self._acquiring = False
        self._lease: Lease | None = None
        #: A lease lost with the session and not yet released: its tracking is dropped on release.
        self._lost_lease: Lease | None = None
        self._losses = 0
        self._wakeup = threading.Event()
        self._listeners: list[Callable[[LockLost], None]] = []

    @property
    def lease(self) -> Lease | None:
        """The lease this object holds, or None (also once its session was lost)."""
        return self._lease

    @property
    def held(self) -> bool:
        """True while this object holds the lock and its session was not lost."""
        return self._lease is not None

    def acquire(self, timeout: float | None = None, blocking: bool = True) -> Lease | None:
        """Wait in line for the lock, at most ``timeout`` seconds (None: no limit; not ``blocking``:
        no wait); the lease, or None if the time ran out. ``MemberExistsError`` if this object already
        holds or is acquiring; ``SessionLostError`` if the session was lost meanwhile."""
        limit = check_timeout(timeout, blocking)
        with self._mutex:
            if self._acquiring or self._lease is not None:
                raise MemberExistsError(f"this Lock object already holds or is acquiring {self.name!r}")
            self._acquiring = True
            lost, self._lost_lease = self._lost_lease, None
        try:
            if lost is not None:
                self._step_out(lost, quietly=True)
            deadline = None if limit is None else time.monotonic() + limit
            self._session.add_state_listener(self._on_state)
            return self._queue_up(deadline)
        finally:
            with self._mutex:
                self._acquiring = False
            self._stop_listening()

    def release(self) -> None:
        """Give the lease back; the next in line takes over. ``NotAMemberError`` if this object holds
        no lease. A lease lost with the session is only forgotten."""
        with self._mutex:
            lease, lost = self._lease, self._lost_lease
            if lease is None and lost is None:
                raise NotAMemberError(f"this Lock object does not hold {self.name!r}")
            self._lease = self._lost_lease = None
        try:
            if lease is not None:
                self._step_out(lease)
            elif lost is not None:
                self._step_out(lost, quietly=True)
        finally:
            self._stop_listening()

    def add_listener(self, callback: Callable[[LockLost], None]) -> None:
        """Call ``callback(LockLost)`` on the dispatcher thread when a held lease is lost with the
        session (before any other event of that loss reaches this lock)."""
        if not callable(callback):
            raise TypeError(f"callback must be callable, not {type(callback).__name__}")
        with self._mutex:
            if callback not in self._listeners:
                self._listeners.append(callback)

    def remove_listener(self, callback: Callable[[LockLost], None]) -> None:
        """Stop calling ``callback``; unknown callbacks are ignored."""
        with self._mutex:
            if callback in self._listeners:
                self._listeners.remove(callback)

    def __enter__(self) -> Lease:
        lease = self.acquire()
        assert lease is not None  # no time limit
        return lease

    def __exit__(self, *exc_info: object) -> None:
        if self._lease is not None or self._lost_lease is not None:
            self.release()

    def __repr__(self) -> str:
        kind = "shared" if self.shared else "exclusive"
        return f"<Lock {self.name!r} {kind} {'held' if self.held else 'free'}>"

    # The recipe.

    def _queue_up(self, deadline: float | None) -> Lease | None:
        """Queue, wait to lead the queue (and, exclusive, for the shared holders to leave); the lease
        or None when ``deadline`` passed (the candidacy withdrawn)."""
        session, service = self._session, self._service
        losses = self._losses
        lease = Lease(self.name, 0, self.shared, uuid.uuid4().hex)
        holder = lease.holder
        watching: list[Target] = []
        try:
            session.nominate(service, holder, rejoin=False)
            token = self._wait_to_lead(holder, deadline, losses, watching)
            if token is not None and self.shared:
                session.join(service, holder, b"", rejoin=False)
                session.resign(service, holder)
            elif token is not None and not self._wait_no_readers(deadline, losses, watching):
                token = None
            if token is None:
                self._step_out(lease)
                return None
            with self._mutex:
                self._check_alive(losses)
                self._lease = Lease(self.name, token, self.shared, holder)
                return self._lease
        except BaseException:
            self._step_out(lease, quietly=True, unknown=True)
            raise
        finally:
            for target in watching:
                session.remove_listener(target, self._wake)

    def _wait_to_lead(
        self, holder: str, deadline: float | None, losses: int, watching: list[Target]
    ) -> int | None:
        while True:
            self._wakeup.clear()
            current = self._session.backend_for_call().leadership(self._service)
            if current is not None and current.leader_id == holder:
                return current.term
            if not self._pause(deadline, losses, watching, TargetKind.ELECTION):
                return None

    def _wait_no_readers(self, deadline: float | None, losses: int, watching: list[Target]) -> bool:
        while True:
            self._wakeup.clear()
            if not self._session.backend_for_call().membership(self._service):
                return True
            if not self._pause(deadline, losses, watching, TargetKind.GROUP):
                return False

    def _pause(self, deadline: float | None, losses: int, watching: list[Target], kind: TargetKind) -> bool:
        """Wait for a change of the watched queue or group (or ``RECHECK_INTERVAL``); False once
        ``deadline`` passed. ``SessionLostError`` if the session was lost since ``losses``."""
        self._check_alive(losses)
        left = RECHECK_INTERVAL if deadline is None else deadline - time.monotonic()
        if left <= 0:
            return False
        target = Target(kind, self._service)
        if target not in watching:
            watching.append(target)
            self._session.add_listener(target, self._wake)
        self._wakeup.wait(min(left, RECHECK_INTERVAL))
        self._check_alive(losses)
        return True

    def _check_alive(self, losses: int) -> None:
        if self._losses != losses or self._session.state is SessionState.CLOSED:
            raise SessionLostError(f"the session was lost while acquiring lock {self.name!r}")

    def _step_out(self, lease: Lease, *, quietly: bool = False, unknown: bool = False) -> None:
        """Leave the queue and the shared holders, whichever this session still tracks (what a lost
        session held is gone already); ``quietly``: errors are ignored. ``unknown``: a queue or group
        call failed with an unknown effect, so untracked places are withdrawn from the backend too
        (a place left behind would block the lock until the session ends)."""
        session, service, holder = self._session, self._service, lease.holder
        failure: ConsensusError | None = None
        backend = session.backend_for_call
        places: list[tuple[Callable[[str, str], bool], Callable[[str, str], None], Callable[[], Any]]] = [
            (session.holds_candidacy, session.resign, lambda: backend().resign(service, holder)),
            (session.holds_member, session.leave, lambda: backend().leave(service, holder)),
        ]
        for tracked, step, withdraw in places:
            try:
                if tracked(service, holder):
                    step(service, holder)
                elif unknown:
                    withdraw()
            except NotAMemberError:
                pass  # voided by a session loss meanwhile, or never placed
            except ConsensusError as exc:
                failure = failure or exc
        if failure is not None and not quietly:
            raise failure

    def _stop_listening(self) -> None:
        with self._mutex:
            idle = not self._acquiring and self._lease is None
        if idle:
            self._session.remove_state_listener(self._on_state)

    def _wake(self, _event: object) -> None:
        self._wakeup.set()

    def _on_state(self, state: SessionState) -> None:
        if state not in (SessionState.LOST, SessionState.CLOSED):
            return
        with self._mutex:
            self._losses += 1
            lease, self._lease = self._lease, None
            if lease is not None:
                self._lost_lease = lease
            listeners = list(self._listeners) if lease is not None and state is SessionState.LOST else []
        self._wakeup.set()
        if lease is None:
            return
        for listener in listeners:
            try:
                listener(LockLost(self.name, lease.token))
            except Exception:
                log.exception("lock listener %r raised; delivery continues", listener)
