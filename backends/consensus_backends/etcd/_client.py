"""The etcd client's calls: reads, transactions, leases, status and watches, in etcd's terms.

Each is one ``_call`` of ``_calls.RetryingCalls`` (whose docstring states how calls are
retried, fail over and end in trouble) with what makes it safe: reads, lease grants and revokes
are retried until their deadline, a transaction is never sent twice, a keep-alive gets one
attempt. Each watch gets a channel of its own, closed when the watch is replaced.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import grpc
from pyetcd import etcdrpc
from pyetcd.exceptions import NoServerAvailableError, RevisionCompactedError, WatchTimedOut
from pyetcd.watch import Watcher

from consensus_api.errors import ConfigurationError, ConsensusError, OperationTimeoutError, SessionLostError
from consensus_backends.etcd._calls import REQUIRE_LEADER, RetryingCalls, Stubs
from consensus_backends.etcd._channel import open_endpoint
from consensus_backends.etcd._errors import TLS_REFUSED, AuthDisabledError, Code, CompactedError, translate

log = logging.getLogger("consensus_api.etcd")


class EtcdClient(RetryingCalls):
    """The connection to one etcd cluster and the calls the backend makes; thread-safe."""

    def authenticate(self, deadline: float) -> None:
        """Get an auth token when the URL names a user; ``ConfigurationError`` if etcd refuses it."""
        if self._user is None:
            return
        request = etcdrpc.AuthenticateRequest(name=self._user, password=self._password or "")
        try:
            response = self._call(
                "authentication", _authenticate, request, deadline, retry=True, authenticated=False
            )
        except ConfigurationError as exc:
            if str(exc).startswith(TLS_REFUSED):
                raise
            raise ConfigurationError(f"etcd refused the credentials of user {self._user!r}: {exc}") from None
        except AuthDisabledError:  # as etcd's own client does: no token needed
            log.debug("etcd has authentication disabled; connecting without a token")
            return
        self._metadata = (REQUIRE_LEADER, ("token", response.token))

    def range(self, request: Any, deadline: float) -> Any:
        """A RangeResponse; linearizable unless the request says otherwise. ``read_revision`` is the
        highest revision a read has returned."""
        response = self._call("a read", _range, request, deadline, retry=True)
        revision = int(response.header.revision)
        if revision > self.read_revision:
            with self._floor_lock:
                self.read_revision = max(self.read_revision, revision)
        return response

    def txn(self, request: Any, deadline: float) -> Any:
        """A TxnResponse; never sent twice."""
        return self._call("a transaction", _txn, request, deadline, retry=False)

    def revision(self, key: bytes, deadline: float) -> int:
        """The cluster's current revision, from a linearizable count of ``key`` (which the user may read)."""
        return int(self.range(etcdrpc.RangeRequest(key=key, count_only=True), deadline).header.revision)

    def status_version(self, deadline: float) -> str:
        """The server version from the Maintenance ``Status`` call of the endpoint in use."""
        response = self._call(
            "a status request",
            lambda s: etcdrpc.MaintenanceStub(s.channel).Status,
            etcdrpc.StatusRequest(),
            deadline,
            retry=True,
        )
        return str(response.version)

    def grant(self, ttl: int, deadline: float) -> tuple[int, int]:
        """A new lease: its id and the TTL etcd granted (at least the cluster's minimum)."""
        request = etcdrpc.LeaseGrantRequest(TTL=ttl)
        response = self._call("a lease grant", lambda s: s.lease.LeaseGrant, request, deadline, retry=True)
        if response.error:
            raise ConsensusError(f"etcd refused a lease: {response.error}")
        return int(response.ID), int(response.TTL)

    def revoke(self, lease_id: int, deadline: float) -> None:
        """Revoke a lease, deleting its keys; a lease that is already gone is fine."""
        request = etcdrpc.LeaseRevokeRequest(ID=lease_id)
        with contextlib.suppress(SessionLostError):
            self._call("a lease revoke", lambda s: s.lease.LeaseRevoke, request, deadline, retry=True)

    def keepalive(self, lease_id: int, deadline: float) -> int:
        """One keep-alive, one attempt; the remaining TTL (0: the lease is gone)."""

        def first_answer(call: Any) -> int:
            try:
                return int(next(call).TTL)
            except StopIteration:
                raise OperationTimeoutError("etcd closed a keep-alive stream without answering") from None
            finally:
                call.cancel()

        request = etcdrpc.LeaseKeepAliveRequest(ID=lease_id)
        return int(
            self._call(
                "a lease keep-alive",
                lambda s: s.lease.LeaseKeepAlive,
                request,
                deadline,
                retry=False,
                stream=first_answer,
            )
        )

    def subscribe(
        self,
        key: bytes,
        range_end: bytes,
        start_revision: int,
        callback: Callable[[Any], None],
        deadline: float,
    ) -> Callable[[], None]:
        """Watch ``[key, range_end)`` from ``start_revision`` on a channel of its own.

        pyetcd calls ``callback`` on its watch thread with each response, then
        once with the error (or None) that ends the stream. Returns the function
        that closes the channel and so ends the watch.
        """
        try:
            self._current_stubs()  # fails over from an endpoint marked failed
        except (NoServerAvailableError, ValueError):
            raise OperationTimeoutError("no etcd endpoint is reachable for a watch") from None
        with self._lock:
            host, port = self._addresses[self._client.endpoint_in_use.netloc]
        endpoint = open_endpoint(host, port, self._tls)
        watcher = Watcher(
            etcdrpc.WatchStub(endpoint.channel),
            timeout=max(deadline - time.monotonic(), 0.01),
            metadata=self._metadata,
        )
        try:
            watcher.add_callback(
                key, callback, range_end=range_end, start_revision=start_revision, progress_notify=True
            )
        except RevisionCompactedError:
            endpoint.close()
            raise CompactedError("the watch's start revision was compacted") from None
        except WatchTimedOut:
            endpoint.close()
            raise OperationTimeoutError("etcd did not create a watch in time") from None
        except grpc.RpcError as exc:
            endpoint.close()
            if exc.code() is Code.UNAVAILABLE:
                self._endpoint_failed()
            raise translate(exc, "creating a watch") from None
        close: Callable[[], None] = endpoint.close
        return close


def _authenticate(stubs: Stubs) -> Any:
    return stubs.auth.Authenticate


def _range(stubs: Stubs) -> Any:
    return stubs.kv.Range


def _txn(stubs: Stubs) -> Any:
    return stubs.kv.Txn
