"""The session's lease: kept alive by a thread of ours, replaced when lost.

One lease per session (TTL = ``session_timeout``, rounded up to whole seconds;
etcd may grant more). Every member and candidate key is bound to it, so they
all vanish together when it ends. A lease is announced (``announce``: the
session's key under ``migration/sessions``) before it is used; one that
cannot be is revoked, as if the grant had failed. The keeper thread sends one
keep-alive every TTL/3, and states follow from the answers:

* a keep-alive fails, but the last successful one was *sent* less than a TTL
  ago: SUSPENDED (the lease is certainly still alive on the server);
* etcd answers that the lease is gone (expired or revoked), keep-alives
  failed until a TTL after the last successful one was sent, or an answer
  arrives too late to vouch for the lease (this process was paused): LOST.
  A keeper that did not run for a whole TTL (this process or thread was held
  up) asks etcd once more before it decides, changing no state meanwhile (a
  SUSPENDED would cut short calls that etcd answers definitely): the lease may
  well live on, and revoking it would hand the session's members and
  resources to others while this session still acts on them. Only a LOST
  after keep-alives failed is connection trouble, which cuts the calls in
  flight short (``lost_in_trouble``). A lease that may still exist is
  revoked before a new one is granted, so the old session's keys are gone
  before the core re-joins anything; then CONNECTED.
* a keep-alive succeeds again: CONNECTED.

The thread is also woken at once when the watch sees trouble or one of the
session's own keys deleted (``LeasedKeys``, the keys members and candidates
are), so a revoked lease is noticed in milliseconds.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any

from consensus_api.errors import ConsensusError, NotAMemberError, SessionLostError
from consensus_api.model import SessionState
from consensus_backends.etcd import requests as rq
from consensus_backends.etcd.client import EtcdClient

log = logging.getLogger("consensus_api.etcd")

#: Seconds between attempts while the lease is in trouble.
TROUBLE_PAUSE = 0.25


class LeaseKeeper:
    """Owns the session's lease and reports SUSPENDED, LOST and CONNECTED through ``report``."""

    def __init__(
        self,
        client: EtcdClient,
        session_timeout: float,
        request_timeout: float,
        report: Callable[[SessionState], None],
        announce: Callable[[int, float], None],
    ) -> None:
        self._client = client
        self._announce = announce
        self._requested_ttl = max(1, math.ceil(session_timeout))
        self._attempt_timeout = min(request_timeout, max(self._requested_ttl / 3, 1.0))
        self._report = report
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopped = False
        self._state = SessionState.CONNECTED
        self._lease: int | None = None
        self._stale: int | None = None
        #: Whether the lease was last found lost because etcd was unreachable for its whole TTL (not
        #: because it expired while this process was paused, or etcd answered it is gone).
        self.lost_in_trouble = False
        self._ttl = self._requested_ttl
        self._alive_since = 0.0
        self._thread = threading.Thread(target=self._run, name="consensus-etcd-lease", daemon=True)

    def start(self, deadline: float) -> None:
        """Grant the first lease (raising ``ConsensusError`` if that fails by ``deadline``), then keep it."""
        self._grant(deadline)
        self._thread.start()

    def current(self) -> int:
        """The id of the live lease; ``SessionLostError`` while the session is being re-established."""
        lease = self._lease
        if lease is None:
            raise SessionLostError("the etcd session was lost and is being re-established")
        return lease

    def held(self) -> int | None:
        """The id of the live lease, or None while the session is being re-established."""
        return self._lease

    def check_now(self) -> None:
        """Send a keep-alive now (something suggests the lease or the connection is gone)."""
        self._wake.set()

    def stop(self, revoke_deadline: float) -> None:
        """End the thread and revoke the lease (best effort until ``revoke_deadline``)."""
        with self._lock:
            self._stopped = True
            leases = [lease for lease in (self._lease, self._stale) if lease is not None]
            self._lease = self._stale = None
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(max(revoke_deadline - time.monotonic(), 0))
        for lease in leases:
            try:
                self._client.revoke(lease, revoke_deadline)
            except ConsensusError as exc:
                log.info(
                    "could not revoke the session's lease on close (%s); it expires in %ss", exc, self._ttl
                )

    def _run(self) -> None:
        while True:
            pause = self._ttl / 3 if self._state is SessionState.CONNECTED else TROUBLE_PAUSE
            self._wake.wait(pause)
            self._wake.clear()
            if self._stopped:
                return
            try:
                if self._lease is None:
                    self._replace()
                else:
                    self._keep_alive(self._lease)
            except ConsensusError as exc:
                log.debug("etcd lease upkeep failed: %s", exc)
            except Exception:
                if self._stopped:  # the connection was closed under a late call
                    return
                log.exception("unexpected error in the etcd lease thread; it keeps running")

    def _keep_alive(self, lease: int) -> None:
        sent = time.monotonic()
        lost_at = self._alive_since + self._ttl
        late = sent >= lost_at  # this process (or this thread) did not run for the whole TTL
        if late:  # only etcd can tell whether the lease lives on (a new etcd leader renews every lease)
            log.info("no etcd keep-alive was sent for the whole lease TTL (%ss): asking etcd", self._ttl)
        try:
            remaining = self._client.keepalive(
                lease, sent + self._attempt_timeout if late else min(sent + self._attempt_timeout, lost_at)
            )
        except ConsensusError as exc:
            if time.monotonic() >= lost_at:
                log.warning("etcd was unreachable for the whole lease TTL (%ss): session lost", self._ttl)
                self._lose(stale=lease, trouble=True)
            else:
                log.debug("etcd keep-alive failed (%s): session suspended", exc)
                self._set(SessionState.SUSPENDED)
            return
        if remaining <= 0:
            log.warning("the session's etcd lease expired or was revoked: session lost")
            self._lose(stale=None, trouble=False)
            return
        if time.monotonic() >= sent + remaining:  # the answer came too late to vouch for the lease
            log.warning("an etcd keep-alive took longer than the lease TTL: session lost")
            self._lose(stale=lease, trouble=False)
            return
        self._alive_since = sent
        self._set(SessionState.CONNECTED)

    def _lose(self, stale: int | None, trouble: bool) -> None:
        with self._lock:
            self._lease = None
            self._stale = stale
            self.lost_in_trouble = trouble
        self._set(SessionState.LOST)
        self._wake.set()

    def _replace(self) -> None:
        deadline = time.monotonic() + self._attempt_timeout
        if self._stale is not None:
            self._client.revoke(self._stale, deadline)
            self._stale = None
        self._grant(deadline)
        self._set(SessionState.CONNECTED)

    def _grant(self, deadline: float) -> None:
        sent = time.monotonic()
        lease, ttl = self._client.grant(self._requested_ttl, deadline)
        try:
            self._announce(lease, deadline)
        except ConsensusError:
            with contextlib.suppress(ConsensusError):  # else it expires after its TTL
                self._client.revoke(lease, deadline)
            raise
        with self._lock:
            if not self._stopped:
                self._lease, self._ttl, self._alive_since = lease, ttl, sent
                return
        self._client.revoke(lease, deadline)

    def _set(self, state: SessionState) -> None:
        with self._lock:
            if self._stopped or state is self._state:
                return
            self._state = state
        self._report(state)


class LeasedKeys:
    """The keys this session binds to its lease (members and candidates); each call is bounded by
    ``request_timeout``.

    * ``create`` makes a key, bound to the lease, in one transaction that fails if
      the key exists: a live member or candidate with that id is never replaced.
      All of them vanish with the lease.
    * ``release`` deletes a key only if this session's lease holds it; without a
      lease (the session was lost) the key is gone or soon will be.
    * The session's own keys are remembered, so the watch's report that one was
      deleted wakes the keeper at once (a revoked lease is noticed in milliseconds).
    """

    def __init__(self, client: EtcdClient, keeper: LeaseKeeper, request_timeout: float) -> None:
        self._client = client
        self._keeper = keeper
        self._timeout = request_timeout
        self._lock = threading.Lock()
        self._owned: set[bytes] = set()

    def create(self, target: bytes, value: bytes, then: list[Any]) -> Any:
        """Create ``target`` bound to the session's lease if it does not exist; runs ``then`` too."""
        lease = self._keeper.current()
        request = rq.txn([rq.created_is(target, 0)], [rq.put(target, value, lease), *then], [])
        try:
            response = self._client.txn(request, self._deadline())
        except SessionLostError:
            self._keeper.check_now()
            raise
        if response.succeeded:
            with self._lock:
                self._owned.add(target)
        return response

    def release(self, target: bytes, what: str) -> None:
        """Delete ``target`` if it is bound to the session's lease.

        Without a lease (the session was lost) the key is gone or will be gone
        before a new lease exists, and so is a key found missing: both count as
        released. A key held by another session is ``NotAMemberError``.
        """
        with self._lock:
            self._owned.discard(target)
        lease = self._keeper.held()
        if lease is None:
            return
        request = rq.txn([rq.leased_by(target, lease)], [rq.delete(target)], [rq.read_meta(target)])
        response = self._client.txn(request, self._deadline())
        if not response.succeeded and response.responses[0].response_range.kvs:
            raise NotAMemberError(f"{what} is held by another session")

    def forget(self) -> None:
        """The lease was lost: none of the keys it held is this session's any more."""
        with self._lock:
            self._owned.clear()

    def deleted(self, key: bytes) -> None:
        """From the watch: ``key`` vanished; if it was ours, perhaps with our lease: check it now."""
        with self._lock:
            ours = key in self._owned
        if ours:
            self._keeper.check_now()

    def _deadline(self) -> float:
        return time.monotonic() + self._timeout
