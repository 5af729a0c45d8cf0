"""The session: a key with a TTL of ``session_timeout``, renewed by a heartbeat thread.

Expiry is judged by the server's clock only: Redis expires the key itself. The
renewal script also reaps sessions whose key has expired (their members and
candidates go, with their change entries), and returns when the earliest
other lease expires; the next heartbeat comes then (plus ``REAP_SLACK``) if
that is sooner than ``session_timeout / 3``, so while any session lives a dead
one is reaped as its key expires. Reads of a group or an election reap its
dead owners too, so no read returns a member of an expired session.

States: a renewal that fails is SUSPENDED (tried again every
``TROUBLE_PAUSE``, and as the lease lapses); no renewal until the lease is
presumed lapsed (``consensus_api.backend.lapses_at``: a margin before the key
can expire, counted from the *start* of the last successful renewal), or a
renewal that finds the key gone, is LOST. Then a new session id is opened by
a script that first drops what the old one held, and CONNECTED follows.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from consensus_api.backend import lapses_at, retry_pause
from consensus_api.errors import BackendUnavailableError, OperationTimeoutError, SessionLostError
from consensus_api.model import SessionState
from consensus_redis import scripts
from consensus_redis.client import RedisClient, Script

log = logging.getLogger("consensus_api.redis")

#: Seconds between heartbeats while the server is unreachable.
TROUBLE_PAUSE = 0.25
#: A heartbeat due to reap a lease comes this long after it expires; the shortest pause between beats.
REAP_SLACK = 0.01

OPEN = Script(scripts.OPEN)
RENEW = Script(scripts.RENEW)
CLOSE = Script(scripts.CLOSE)


class Lease:
    """The session key of one backend session and the thread that keeps it."""

    def __init__(
        self,
        client: RedisClient,
        prefix: str,
        session_timeout: float,
        report: Callable[[SessionState], None],
    ) -> None:
        self._client = client
        self._prefix = prefix
        self._ttl = session_timeout
        self._ttl_ms = max(1, round(session_timeout * 1000))
        self._report_to = report
        self.session_id = uuid.uuid4().hex
        self._state = SessionState.CONNECTED
        self._state_lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="consensus-redis-heartbeat", daemon=True)

    def open(self, deadline: float) -> None:
        """Create the session key (retrying until ``deadline``: sending it twice only sets the new key
        twice) and start the heartbeat."""
        self._client.run(
            OPEN, self._prefix, self.session_id, self._ttl_ms, "", write=False, deadline=deadline
        )
        self._thread.start()

    def close(self) -> None:
        """Stop the heartbeat and drop the session (members and candidates go at once)."""
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(self._client.request_timeout)
        try:
            self._client.run(CLOSE, self._prefix, self.session_id)
        except (OperationTimeoutError, BackendUnavailableError) as exc:
            log.warning("could not drop the session at close (%s); it expires by itself", exc)

    def check_now(self) -> None:
        """Renew at once (a script found the session gone)."""
        self._wake.set()

    def call(self, script: Script, *args: str | bytes) -> list[Any]:
        """Run a membership or election script as this session; ``SessionLostError`` if the session
        is gone on the server (the heartbeat then renews at once, and finds it gone)."""
        reply = self._client.run(script, self._prefix, self.session_id, *args)
        if reply[0] == "lost":
            self.check_now()
            raise SessionLostError("this session has expired on the server; it is being re-established")
        return reply

    def _beat(self) -> None:
        last_renewal = time.monotonic()
        pause = self._ttl / 3
        while True:
            self._wake.wait(pause)
            self._wake.clear()
            if self._stop.is_set():
                return
            started = time.monotonic()
            pause = TROUBLE_PAUSE
            lapse = lapses_at(last_renewal, self._ttl)
            if self._state is not SessionState.LOST and started >= lapse:
                self._report(SessionState.LOST)  # the key may expire any moment now, by our own clock
            try:
                if self._state is SessionState.LOST:
                    self._replace()
                    next_expiry: float | None = self._ttl
                else:
                    next_expiry = self._renew(min(started + self._client.request_timeout, lapse))
            except (OperationTimeoutError, BackendUnavailableError) as exc:
                log.debug("heartbeat failed: %s", exc)
                lost = time.monotonic() >= lapse or self._state is SessionState.LOST
                self._report(SessionState.LOST if lost else SessionState.SUSPENDED)
                if not lost:
                    pause = retry_pause(TROUBLE_PAUSE, lapse, REAP_SLACK)
                continue
            if next_expiry is None:
                self._report(SessionState.LOST)
                try:
                    self._replace()
                except (OperationTimeoutError, BackendUnavailableError) as exc:
                    log.debug("re-establishing the session failed: %s", exc)
                    continue
                next_expiry = self._ttl
            last_renewal = started
            pause = min(self._ttl / 3, max(next_expiry, 0.0) + REAP_SLACK)
            self._report(SessionState.CONNECTED)

    def _renew(self, deadline: float) -> float | None:
        """One renewal, cut off at ``deadline``: seconds until the earliest lease expires, or None if
        ours was gone. SUSPENDED is reported if it is still running after ``session_timeout / 3``."""
        timer = threading.Timer(self._ttl / 3, self._report, (SessionState.SUSPENDED, True))
        timer.daemon = True
        timer.start()
        try:
            reply = self._client.run(
                RENEW, self._prefix, self.session_id, self._ttl_ms, deadline=deadline, retry=False
            )
        finally:
            timer.cancel()
        return None if reply[0] == "lost" else float(reply[1]) / 1000

    def _replace(self) -> None:
        """After a loss: drop what is left of the old session and open a new one."""
        new = uuid.uuid4().hex
        self._client.run(OPEN, self._prefix, new, self._ttl_ms, self.session_id, retry=False)
        self.session_id = new

    def _report(self, state: SessionState, only_if_connected: bool = False) -> None:
        with self._state_lock:
            if state is self._state or (only_if_connected and self._state is not SessionState.CONNECTED):
                return
            self._state = state
        self._report_to(state)
