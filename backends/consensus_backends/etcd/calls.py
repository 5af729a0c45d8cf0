"""The etcd client's call plumbing: explicit deadlines, safe retries, failover and trouble.

Unary calls use the channel of pyetcd's ``MultiEndpointEtcd3Client`` (which
picks an endpoint and fails over once one is marked failed) with an explicit
deadline and the auth token as metadata; grpc errors become consensus_api errors.

* Calls fail fast without a connection (no ``wait_for_ready``) and are sent
  again only when that is harmless: reads, lease grants and revokes are retried
  until their deadline; transactions only when grpc reports that no connection
  could be made (nothing was sent). A transaction whose connection broke raises
  ``OperationTimeoutError``: its effect is unknown.
* A call that finds its endpoint unreachable marks it failed, so the next one
  goes to another endpoint; with several endpoints, retried calls also give up
  on an endpoint after ``FIRST_ATTEMPT`` seconds (doubling per attempt).
* While the session is healthy, unary calls are blocking grpc calls, answered
  on the calling thread (a future's answer crosses from grpc's polling thread:
  ~100 µs more per call); in trouble they are futures.
* While the session is in trouble (``set_troubled``), calls make one attempt,
  and every transition into trouble ends the calls in flight (futures are
  cancelled; blocking calls end with their channel, closed and replaced):
  nobody (the core's dispatcher least of all) waits out a long deadline on a
  dead or paused server.
* Every call requires the member to know a leader (``REQUIRE_LEADER``): a
  member cut off from its cluster refuses at once, and the client fails over.
* An idle stream stays open on the unary calls' channel (``warm.KeepWarm``):
  without one, grpc starts a polling thread for every call made through a
  future or a stream (keep-alives, calls in trouble), which costs more than
  the call itself on a loaded machine.

``client.EtcdClient`` holds one ``RetryingCalls`` and makes each of its calls
through ``call``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import pyetcd
from pyetcd import etcdrpc
from pyetcd.exceptions import NoServerAvailableError

from consensus_api.errors import ConfigurationError, ConsensusError, OperationTimeoutError, SessionLostError
from consensus_backends.etcd.channel import TLS, netloc, open_aio_channel, open_endpoint
from consensus_backends.etcd.errors import (
    NOT_SENT,
    TLS_REFUSED,
    AuthDisabledError,
    Code,
    certificate_refused,
    interrupted,
    translate,
)
from consensus_backends.etcd.warm import KeepWarm, Metadata

log = logging.getLogger("consensus_api.etcd")

#: Seconds between attempts of a retried call.
RETRY_PAUSE = 0.1

#: With several endpoints, the first attempt of a retried call ends after this many seconds
#: (then twice as long, and so on) and the next attempt goes to another endpoint.
FIRST_ATTEMPT = 1.0

#: Seconds a call trusts the endpoint in use and its stubs without asking pyetcd again.
RECHECK = 0.5

#: Sent with every call (etcd's ``WithRequireLeader``): a member that knows no leader (cut off from
#: the others) refuses at once with ``no leader`` (UNAVAILABLE), and ends its watch streams, instead
#: of letting the call wait out its deadline; the call then goes to another endpoint.
REQUIRE_LEADER = ("hasleader", "true")
#: Picks the grpc multi-callable of a call from the stubs of the channel in use.
Method = Callable[["Stubs"], Any]


@dataclass(frozen=True, slots=True)
class Stubs:
    """The grpc stubs of one channel."""

    channel: Any
    kv: Any
    lease: Any
    auth: Any
    #: The endpoint's ``(host, port)``.
    address: tuple[str, int]


class RetryingCalls:
    """The connection to one etcd cluster, its auth token, and the loop every call runs in
    (``call``); thread-safe."""

    def __init__(
        self,
        endpoints: Sequence[tuple[str, int]],
        *,
        tls: TLS | None,
        user: str | None,
        password: str | None,
        request_timeout: float,
    ) -> None:
        self._tls = tls
        self._user = user
        self._password = password
        self._addresses = {netloc(host, port): (host, port) for host, port in endpoints}
        self._lock = threading.Lock()
        self._stubs: Stubs | None = None
        self._recheck_at = 0.0
        self._warm: KeepWarm | None = None
        self._closed = False
        self._metadata: Metadata = (REQUIRE_LEADER,)
        self._troubled = False
        self._troubles = 0
        self._in_flight: set[Any] = set()
        self._trouble_listeners: list[Callable[[], None]] = []
        self._client = pyetcd.MultiEndpointEtcd3Client(
            endpoints=[open_endpoint(host, port, self._tls) for host, port in endpoints],
            timeout=request_timeout,
            failover=True,
        )

    def close(self) -> None:
        """Close every channel; calls in flight fail."""
        with self._lock:
            warm, self._warm, self._closed = self._warm, None, True
        if warm is not None:
            warm.close()
        self._client.close()

    def set_troubled(self, troubled: bool) -> None:
        """Enter trouble (ending every call in flight) or leave it.

        Futures are cancelled; blocking calls end with their channel, which is
        closed and replaced (the next call connects again)."""
        old = None
        with self._lock:
            self._troubled = troubled
            if troubled:
                self._troubles += 1
            cancel = list(self._in_flight) if troubled else []
            endpoint = self._client.endpoint_in_use
            if troubled and not self._closed and endpoint is not None:
                host, port = self._addresses[endpoint.netloc]
                old, endpoint.channel = endpoint.channel, open_endpoint(host, port, self._tls).channel
                self._recheck_at = 0.0
        for call in cancel:
            call.cancel()
        if troubled:
            for listener in list(self._trouble_listeners):
                listener()
        if old is not None:
            old.close()

    def on_trouble(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call ``listener`` (on the thread that reports it, at once) whenever trouble begins, so
        calls made elsewhere (``aio``) end too; returns what stops that."""
        with self._lock:
            self._trouble_listeners.append(listener)

        def remove() -> None:
            with self._lock:
                if listener in self._trouble_listeners:
                    self._trouble_listeners.remove(listener)

        return remove

    def open_aio_channel(self, address: tuple[str, int]) -> grpc.aio.Channel:
        """A ``grpc.aio`` channel to ``address`` like the unary calls' channels (TLS, options)."""
        return open_aio_channel(*address, self._tls)

    def authenticate(self, deadline: float) -> None:
        """Get an auth token when the URL names a user; ``ConfigurationError`` if etcd refuses it
        (``call`` asks again once a token expired)."""
        if self._user is None:
            return
        try:
            response = self.call(
                "authentication", _authenticate, self.credentials(), deadline, retry=True, authenticated=False
            )
        except ConsensusError as exc:
            self.refused(exc)
            return
        self.use_token(response.token)

    def credentials(self) -> Any:
        """The AuthenticateRequest of the URL's user (``authenticate``)."""
        return etcdrpc.AuthenticateRequest(name=self._user, password=self._password or "")

    def refused(self, exc: ConsensusError) -> None:
        """Judge an authentication that failed with ``exc``: raise what the caller sees, or return
        where etcd has authentication disabled (as etcd's own client does: no token needed)."""
        if isinstance(exc, AuthDisabledError):
            log.debug("etcd has authentication disabled; connecting without a token")
            return
        if isinstance(exc, ConfigurationError) and not str(exc).startswith(TLS_REFUSED):
            raise ConfigurationError(f"etcd refused the credentials of user {self._user!r}: {exc}") from None
        raise exc

    def use_token(self, token: str) -> None:
        """Send ``token`` with every authenticated call from now on."""
        self._metadata = (REQUIRE_LEADER, ("token", token))

    @property
    def metadata(self) -> Metadata:
        """What every authenticated call carries (the leader requirement, the auth token)."""
        return self._metadata

    @property
    def user(self) -> str | None:
        """The URL's user (None: no authentication)."""
        return self._user

    @property
    def troubled(self) -> bool:
        """Whether the session is in trouble (``set_troubled``): calls make one attempt."""
        return self._troubled

    @property
    def failover(self) -> bool:
        """Whether there are several endpoints: a retried attempt ends after ``FIRST_ATTEMPT``."""
        return len(self._addresses) > 1

    def address(self) -> tuple[str, int] | None:
        """The ``(host, port)`` calls go to now (failing over from an endpoint marked failed, checked
        at most every ``RECHECK`` seconds), or None while every endpoint failed a moment ago."""
        try:
            return self._current_stubs().address
        except (NoServerAvailableError, ValueError):
            return None

    def _current_stubs(self) -> Stubs:
        """The stubs of the endpoint in use; the endpoint and the warm stream are checked at most
        every ``RECHECK`` seconds, and at the next call after an endpoint failed."""
        stubs = self._stubs
        if stubs is not None and time.monotonic() < self._recheck_at:
            return stubs
        with self._lock:
            self._recheck_at = time.monotonic() + RECHECK
            channel = self._client.channel
            if self._stubs is None or self._stubs.channel is not channel:
                self._stubs = Stubs(
                    channel,
                    etcdrpc.KVStub(channel),
                    etcdrpc.LeaseStub(channel),
                    etcdrpc.AuthStub(channel),
                    self._addresses[self._client.endpoint_in_use.netloc],
                )
            warm = self._warm
            if not self._closed and (warm is None or warm.channel is not channel or warm.stale()):
                try:
                    self._warm = KeepWarm(channel, self._metadata)
                except ValueError:  # a closed channel: the call itself reports it
                    self._warm = None
            stubs = self._stubs
        if warm is not None and warm is not self._warm:
            warm.close()
        return stubs

    def endpoint(self) -> str:
        """The ``host:port`` the next call goes to (tests: which member serves this client)."""
        with self._lock:
            return str(self._client.endpoint_in_use.netloc)

    def watch_endpoint(self) -> tuple[Any, Metadata]:
        """A channel of its own to the endpoint in use (after failing over from one marked failed),
        for a watch, which closes it; and the metadata every call carries."""
        try:
            self._current_stubs()
        except (NoServerAvailableError, ValueError):
            raise OperationTimeoutError("no etcd endpoint is reachable for a watch") from None
        with self._lock:
            host, port = self._addresses[self._client.endpoint_in_use.netloc]
        return open_endpoint(host, port, self._tls), self._metadata

    def endpoint_failed(self) -> None:
        """Let the next call fail over to another endpoint, if there is one."""
        with self._lock:
            if len(self._addresses) > 1:
                self._client.endpoint_in_use.fail()
            self._recheck_at = 0.0  # the next call asks pyetcd for the endpoint to use

    def call(
        self,
        what: str,
        method: Method,
        request: Any,
        deadline: float,
        *,
        retry: bool,
        stream: Callable[[Any], Any] | None = None,
        authenticated: bool = True,
    ) -> Any:
        """Send ``request`` until an attempt succeeds or fails for good.

        ``retry``: the call is harmless to repeat. ``stream``: the method is a
        streaming call (``request`` its only message) that gets a single
        attempt, and ``stream(call)`` waits for its answer. ``authenticated``: the call carries the auth token
        (and is sent again once with a new one if etcd says it expired).
        """
        attempt = FIRST_ATTEMPT
        reauthenticate = authenticated
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise OperationTimeoutError(f"etcd did not complete {what} in time")
            try:
                stubs = self._current_stubs()
            except (NoServerAvailableError, ValueError):  # every endpoint failed a moment ago
                if stream is not None or self._troubled:
                    raise OperationTimeoutError(f"no etcd endpoint is reachable for {what}") from None
                time.sleep(min(RETRY_PAUSE, remaining))
                continue
            timeout = min(remaining, attempt) if retry and len(self._addresses) > 1 else remaining
            metadata = self._metadata if authenticated else None
            try:
                troubles = self._troubles
                if stream is None and not self._troubled:  # answered on this thread
                    return method(stubs)(request, timeout=timeout, metadata=metadata)
                if stream is not None:
                    call = method(stubs)(iter([request]), timeout=timeout, metadata=metadata)
                    return self._await(call, stream, troubles)
                call = method(stubs).future(request, timeout=timeout, metadata=metadata)
                return self._await(call, _result, troubles)
            except ValueError:  # grpc refuses calls on a closed channel: closed by us, or replaced
                if self._closed:
                    raise SessionLostError("the etcd connection is closed") from None
                raise interrupted(what) from None
            except grpc.FutureCancelledError:
                raise interrupted(what) from None
            except grpc.RpcError as exc:
                cut_short = timeout < remaining
                if self.after_failure(exc, what, retry=retry, cut_short=cut_short, single=stream is not None):
                    if reauthenticate and self._user is not None:
                        reauthenticate = False  # the token expired; the call was refused, not applied
                        self.authenticate(deadline)
                        continue
                    raise translate(exc, what) from None
                attempt *= 2
                time.sleep(max(min(RETRY_PAUSE, deadline - time.monotonic()), 0))

    def after_failure(self, exc: Any, what: str, *, retry: bool, cut_short: bool, single: bool) -> bool:
        """Judge an attempt that failed with the grpc error ``exc``: raise the error the call ends
        with, or return whether the auth token was refused (True: authenticate again, then send it
        again) or the call goes again to the endpoint in use then (False: pause first).

        ``retry``: harmless to repeat; ``cut_short``: the attempt's timeout was shorter than what
        was left of the call's; ``single``: the call gets one attempt."""
        code = exc.code()
        if code is Code.CANCELLED:
            raise interrupted(what) from None
        if code is Code.UNAUTHENTICATED:
            return True
        if code not in (Code.UNAVAILABLE, Code.DEADLINE_EXCEEDED) or certificate_refused(
            code, exc.details() or ""
        ):
            raise translate(exc, what) from None
        self.endpoint_failed()
        unsent = code is Code.UNAVAILABLE and NOT_SENT in (exc.details() or "")
        again = unsent or (retry and (code is Code.UNAVAILABLE or cut_short))
        if not again or single or self._troubled:
            if unsent:
                raise OperationTimeoutError(f"etcd is unreachable; {what} was not sent") from None
            raise translate(exc, what) from None
        return False

    def _await(self, call: Any, finish: Callable[[Any], Any], troubles: int) -> Any:
        """``finish(call)``, with ``call`` cancelled by trouble that began since it started."""
        with self._lock:
            self._in_flight.add(call)
            if self._troubles != troubles:  # trouble began before the call was registered
                call.cancel()
        try:
            return finish(call)
        finally:
            with self._lock:
                self._in_flight.discard(call)


def _result(call: Any) -> Any:
    return call.result()


def _authenticate(stubs: Stubs) -> Any:
    return stubs.auth.Authenticate
