"""The ZooKeeper session, the lease members and candidates live by: connecting, and its states.

The session's kazoo client keeps it alive (its pings); ``Connection`` follows
the states kazoo reports and decides when the session is lost. Its requests go
through ``client.Pipeline``, which asks it whether the session is the one a
request began in.

Guarantees:

* ``open`` returns by its deadline (``BackendUnavailableError`` otherwise);
  ``abort`` then stops kazoo's threads and closes its sockets before it
  returns, within ``ABORT_WAIT``.
* ``run`` and ``read`` (``client.Pipeline``) return within their deadline, and
  kazoo exceptions never escape them.
* No call spans two sessions: once LOST is reported, a call begun before
  raises ``SessionLostError`` (a write only if it was not sent yet). So a
  read the core started before a loss cannot deliver the new session's view
  before the core has handled LOST.
* States: kazoo's SUSPENDED/LOST/CONNECTED are forwarded in order. As in
  Curator, a connection SUSPENDED for ``session_timeout`` is reported LOST
  (the server has most likely expired the session); if kazoo then resumes that
  very session, it is closed (the server drops its ephemerals at once) and a
  new one is opened before CONNECTED is reported. So after LOST no ephemeral
  of the old session survives into the new one. A LOST because kazoo's own
  connection thread died is followed by a new session too. Should an
  ephemeral of an earlier session still be there (its close not yet
  applied), ``refuse_if_ghost`` makes a create that collides with it a
  passing ``ConsensusError``, not "taken by another session".
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from kazoo.client import KazooClient, KazooState
from kazoo.protocol.states import KeeperState
from kazoo.retry import KazooRetry

from consensus_api.config import BackendURL, Options
from consensus_api.errors import (
    BackendUnavailableError,
    ConfigurationError,
    ConsensusError,
)
from consensus_api.model import SessionState
from consensus_backends.zookeeper.client import Build, Pipeline
from consensus_backends.zookeeper.security import Security

log = logging.getLogger("consensus_api.zookeeper")

DEFAULT_PORT = 2181
#: Seconds ``abort`` waits for kazoo's threads to end once their socket is shut down.
ABORT_WAIT = 2.0


def host_string(url: BackendURL) -> str:
    """kazoo's ``h1:p1,[v6]:p2`` host list for the URL's endpoints."""
    if not url.endpoints:
        raise ConfigurationError(
            "a zookeeper:// URL needs at least one host, e.g. zookeeper://127.0.0.1:2181/app"
        )
    return ",".join(
        f"[{e.host}]:{e.port or DEFAULT_PORT}" if ":" in e.host else f"{e.host}:{e.port or DEFAULT_PORT}"
        for e in url.endpoints
    )


class Connection:
    """One KazooClient, the session state machine around it, and its requests (``Pipeline``)."""

    def __init__(
        self,
        url: BackendURL,
        settings: Options,
        security: Security,
        report: Callable[[SessionState], None],
        on_connected: Callable[[], None],
    ) -> None:
        self._url = url
        self._settings = settings
        self._report = report
        self._on_connected = on_connected
        self._lock = threading.Lock()
        self._state_changed = threading.Condition(self._lock)
        self._connected = False
        self._closing = False
        self._restarting = False
        self._session_id: int | None = None
        #: The ids of this client's earlier sessions (their ephemerals are ghosts once LOST).
        self._past_sessions: set[int] = set()
        self._presumed_lost: int | None = None
        self._epoch = 0
        self._losses = 0
        self._timer: threading.Timer | None = None
        self._security = security
        if security.handler is not None:
            security.handler.on_failure = self._wake
        self.client = KazooClient(
            hosts=host_string(url),
            timeout=settings.session_timeout,
            connection_retry=KazooRetry(max_tries=-1, delay=0.05, backoff=1.5, max_delay=1.0),
            logger=security.logger,
            **security.client_arguments(),
        )
        self.client.add_listener(self._on_state)
        self._requests = Pipeline(self.client, url, settings, self)

    @property
    def session_id(self) -> int | None:
        """The id of the current ZooKeeper session (changes after LOST)."""
        return self._session_id

    @property
    def losses(self) -> int:
        """How many times a session was lost: a result read before it changed is of an old session."""
        return self._losses

    @property
    def connected(self) -> bool:
        """Whether the session is connected now (never waits)."""
        return self._connected

    @property
    def closing(self) -> bool:
        """Whether ``close`` (or ``abort``) was called."""
        return self._closing

    def run(self, build: Build, deadline: float, *, idempotent: bool) -> list[Any]:
        """See ``Pipeline.run``."""
        return self._requests.run(build, deadline, idempotent=idempotent)

    def read(self, build: Build, deadline: float, *, barrier: str | None) -> list[Any]:
        """See ``Pipeline.read``."""
        return self._requests.read(build, deadline, barrier=barrier)

    @property
    def requests(self) -> Pipeline:
        """The requests' pipeline (the asyncio face, ``aio``, shares its rules)."""
        return self._requests

    def answered_lately(self) -> bool:
        """See ``Pipeline.answered_lately``."""
        return self._requests.answered_lately()

    def owns(self, stat: Any) -> bool:
        """Whether ``stat`` is that of an ephemeral znode of the current session."""
        return stat is not None and stat.ephemeralOwner == self._session_id

    def refuse_if_ghost(self, path: str, deadline: float) -> None:
        """A create of ``path`` found it taken: ``ConsensusError`` (retry later) if it is an ephemeral
        of an earlier session of this client, still closing after LOST; otherwise return."""
        [stat] = self.run(lambda client: [client.exists_async(path)], deadline, idempotent=True)
        owner = getattr(stat, "ephemeralOwner", None)
        if owner in self._past_sessions:
            raise ConsensusError(
                f"{path} still belongs to this client's previous ZooKeeper session 0x{owner:x}, which the "
                "server has not closed yet; retry"
            )

    def open(self, deadline: float) -> None:
        """Connect; ``BackendUnavailableError`` at ``deadline``, with kazoo stopped (``abort``)."""
        timeout = self._settings.connect_timeout
        try:
            self.client.start_async()
        except Exception as exc:  # kazoo could not even start its threads
            self.abort()
            raise BackendUnavailableError(f"cannot connect to {self._url.redacted()}: {exc}") from None
        if not self.wait_connected(0, deadline):
            self.abort()
            if self._security.tls_failure is not None:
                raise ConfigurationError(
                    f"cannot connect to ZooKeeper at {self._url.redacted()}: {self._security.tls_failure}"
                )
            raise BackendUnavailableError(
                f"could not connect to ZooKeeper at {self._url.redacted()} within {timeout:g} s"
            )

    def close(self) -> None:
        """Close the session (its ephemerals go at once); waits at most ``request_timeout``."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
            self._connected = False
            self._new_epoch()
        stopper = self._stop_in_background()
        stopper.join(self._settings.request_timeout)

    def abort(self) -> None:
        """After a failed ``open``: stop kazoo without a goodbye to a server that may not answer (its
        socket is shut down first), and wait at most ``ABORT_WAIT`` until its threads have ended."""
        with self._lock:
            self._closing = True
            self._connected = False
            self._state_changed.notify_all()
        client = self.client
        client._stopped.set()  # kazoo's own stop() would send a goodbye and wait 10 s for its answer
        connection = client._connection
        for sock, wake in ((connection._socket, False), (connection._write_sock, True)):
            with contextlib.suppress(OSError, AttributeError):
                sock.send(b"\0") if wake else sock.shutdown(socket.SHUT_RDWR)

        def stop() -> None:
            try:
                client._safe_close()  # the handler's threads, then the connection thread
                client.close()  # its socket pair
            except Exception:
                log.debug("stopping the kazoo client failed", exc_info=True)

        thread = threading.Thread(target=stop, name="consensus-zookeeper-abort", daemon=True)
        thread.start()
        thread.join(ABORT_WAIT)

    def _stop_in_background(self) -> threading.Thread:
        def stop() -> None:
            try:
                self.client.stop()
                self.client.close()
            except Exception:
                log.debug("stopping the kazoo client failed", exc_info=True)

        with self._lock:
            self._closing = True
            self._state_changed.notify_all()
        thread = threading.Thread(target=stop, name="consensus-zookeeper-stop", daemon=True)
        thread.start()
        return thread

    def _wake(self) -> None:
        """Wake the waiters (a TLS certificate was refused: ``open`` gives up at once)."""
        with self._state_changed:
            self._state_changed.notify_all()

    def wait_connected(self, losses: int, deadline: float) -> bool:
        """Wait until connected; False early on a session loss, close, TLS refusal or the deadline."""
        with self._state_changed:
            while (
                not self._connected
                and self._losses == losses
                and not self._closing
                and self._security.tls_failure is None
            ):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._state_changed.wait(remaining)
            return self._connected

    # Session states (kazoo calls _on_state on its connection thread: never block there)

    def _on_state(self, state: str) -> None:
        restart = False
        new_session = False
        with self._lock:
            if self._closing or self._restarting:
                return
            self._new_epoch()
            if state == KazooState.CONNECTED:
                client_id = self.client.client_id
                session_id = client_id[0] if client_id else None
                if self._presumed_lost is not None and session_id == self._presumed_lost:
                    restart = self._restarting = True
                else:
                    self._presumed_lost = None
                    new_session = session_id != self._session_id
                    if new_session and self._session_id is not None:
                        self._past_sessions.add(self._session_id)
                    self._session_id = session_id
                    self._connected = True
                    self._report(SessionState.CONNECTED)
            elif state == KazooState.SUSPENDED:
                self._connected = False
                self._timer = threading.Timer(
                    self._settings.session_timeout, self._expire_locally, (self._epoch,)
                )
                self._timer.daemon = True
                self._timer.start()
                self._report(SessionState.SUSPENDED)
            else:
                self._connected = False
                self._presumed_lost = None
                self._losses += 1
                self._report(SessionState.LOST)
                restart = self._restarting = self._loop_died()
        if restart:
            threading.Thread(target=self._restart, name="consensus-zookeeper-restart", daemon=True).start()
        elif state == KazooState.CONNECTED:
            log.debug("ZooKeeper session 0x%x connected (new: %s)", self._session_id or 0, new_session)
            self._on_connected()

    def _loop_died(self) -> bool:
        """kazoo's connection thread ended on an error of its own (its "unhandled exception in
        connection loop", e.g. "xids do not match" after a server answered out of order): it will
        never reconnect by itself, so the session must be restarted (not after a refused login)."""
        stopped = self.client._connection.connection_stopped.is_set()  # kazoo's loop ended
        return bool(stopped) and self.client.client_state != KeeperState.AUTH_FAILED

    def _new_epoch(self) -> None:
        """A state change: wake waiting calls, invalidate the local-expiry timer (lock held)."""
        self._state_changed.notify_all()
        self._epoch += 1
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire_locally(self, epoch: int) -> None:
        """Still SUSPENDED after ``session_timeout``: the server has most likely expired the session."""
        with self._lock:
            if self._closing or epoch != self._epoch:
                return
            self._presumed_lost = self._session_id
            self._losses += 1
            self._state_changed.notify_all()
            self._report(SessionState.LOST)
        log.info("no ZooKeeper connection for %g s: session presumed lost", self._settings.session_timeout)

    def _restart(self) -> None:
        """kazoo resumed a session presumed lost, or its connection thread died: close the client,
        then start a new session."""
        log.info(
            "ZooKeeper session 0x%x presumed lost or its client stopped: restarting", self._session_id or 0
        )
        try:
            self.client.stop()
        except Exception:
            log.debug("closing the presumed-lost session failed", exc_info=True)
        with self._lock:
            self._restarting = False
            self._presumed_lost = None
            if self._closing:
                return
        try:
            self.client.start_async()
        except Exception:
            log.exception("could not start a new ZooKeeper session")
