"""The etcd client's calls: reads, transactions, leases, status and watches, in etcd's terms.

Each is one ``call`` of ``calls.RetryingCalls`` (whose docstring states how calls are
retried, fail over and end in trouble) with what makes it safe: reads, lease grants and revokes
are retried until their deadline, a transaction is never sent twice, a keep-alive gets one
attempt. Each watch gets a channel of its own, closed when the watch is replaced.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import grpc
from pyetcd import etcdrpc
from pyetcd.exceptions import RevisionCompactedError, WatchTimedOut
from pyetcd.watch import Watcher

from consensus_api.errors import ConsensusError, OperationTimeoutError, SessionLostError
from consensus_backends.etcd.calls import RetryingCalls, Stubs
from consensus_backends.etcd.channel import TLS
from consensus_backends.etcd.errors import Code, CompactedError, translate


class EtcdClient:
    """The connection to one etcd cluster (``RetryingCalls``) and the calls the backend makes;
    thread-safe."""

    def __init__(
        self,
        endpoints: Sequence[tuple[str, int]],
        *,
        tls: TLS | None,
        user: str | None,
        password: str | None,
        request_timeout: float,
    ) -> None:
        self._calls = RetryingCalls(
            endpoints, tls=tls, user=user, password=password, request_timeout=request_timeout
        )
        self._floor_lock = threading.Lock()
        self.read_revision = 0

    def close(self) -> None:
        """Close every channel; calls in flight fail."""
        self._calls.close()

    def set_troubled(self, troubled: bool) -> None:
        """See ``RetryingCalls.set_troubled``."""
        self._calls.set_troubled(troubled)

    def endpoint(self) -> str:
        """The ``host:port`` the next call goes to (tests: which member serves this client)."""
        return self._calls.endpoint()

    def authenticate(self, deadline: float) -> None:
        """See ``RetryingCalls.authenticate``."""
        self._calls.authenticate(deadline)

    def range(self, request: Any, deadline: float) -> Any:
        """A RangeResponse; linearizable unless the request says otherwise. ``read_revision`` is the
        highest revision a read has returned."""
        response = self._calls.call("a read", _range, request, deadline, retry=True)
        self.note_read(response)
        return response

    def note_read(self, response: Any) -> None:
        """Raise ``read_revision`` to the revision of a read's ``response`` (reads made elsewhere too)."""
        revision = int(response.header.revision)
        if revision > self.read_revision:
            with self._floor_lock:
                self.read_revision = max(self.read_revision, revision)

    @property
    def calls(self) -> RetryingCalls:
        """The connection and its call plumbing (for the asyncio face, ``aio``)."""
        return self._calls

    def txn(self, request: Any, deadline: float) -> Any:
        """A TxnResponse; never sent twice."""
        return self._calls.call("a transaction", _txn, request, deadline, retry=False)

    def revision(self, key: bytes, deadline: float) -> int:
        """The cluster's current revision, from a linearizable count of ``key`` (which the user may read)."""
        return int(self.range(etcdrpc.RangeRequest(key=key, count_only=True), deadline).header.revision)

    def status_version(self, deadline: float) -> str:
        """The server version from the Maintenance ``Status`` call of the endpoint in use."""
        response = self._calls.call(
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
        response = self._calls.call(
            "a lease grant", lambda s: s.lease.LeaseGrant, request, deadline, retry=True
        )
        if response.error:
            raise ConsensusError(f"etcd refused a lease: {response.error}")
        return int(response.ID), int(response.TTL)

    def revoke(self, lease_id: int, deadline: float) -> None:
        """Revoke a lease, deleting its keys; a lease that is already gone is fine."""
        request = etcdrpc.LeaseRevokeRequest(ID=lease_id)
        with contextlib.suppress(SessionLostError):
            self._calls.call("a lease revoke", lambda s: s.lease.LeaseRevoke, request, deadline, retry=True)

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
            self._calls.call(
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
        endpoint, metadata = self._calls.watch_endpoint()
        watcher = Watcher(
            etcdrpc.WatchStub(endpoint.channel),
            timeout=max(deadline - time.monotonic(), 0.01),
            metadata=metadata,
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
                self._calls.endpoint_failed()
            raise translate(exc, "creating a watch") from None
        close: Callable[[], None] = endpoint.close
        return close


def _range(stubs: Stubs) -> Any:
    return stubs.kv.Range


def _txn(stubs: Stubs) -> Any:
    return stubs.kv.Txn
