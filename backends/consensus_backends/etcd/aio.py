"""The etcd backend's storage over ``grpc.aio``, awaited on the event loop it was made on.

The same operations as the blocking storage (``storage.StorageSteps``: the same
requests, compares, fence and errors), sent through the generated stubs on a
``grpc.aio`` channel with the credentials, options and auth token of the
backend's connection (``calls.RetryingCalls``), which also decides every
failed attempt (``after_failure``): reads are retried until their deadline, a
transaction only when it was not sent; failover, trouble and errors as there.

Guarantees:

* Every call ends within ``request_timeout``; only ``ConsensusError`` escapes
  (and ``asyncio.CancelledError`` for a call its caller cancelled: effect unknown).
* No thread and no cap on calls in flight: they share one HTTP/2 connection per
  endpoint, multiplexed by grpc.
* When the session runs into trouble the calls in flight end at once, with
  ``OperationTimeoutError`` (effect unknown), as blocking ones do.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any, TypeVar

import grpc
from pyetcd import etcdrpc

from consensus_api.errors import ConsensusError, OperationTimeoutError, SessionLostError
from consensus_api.model import Leadership, Versioned
from consensus_backends.etcd.calls import FIRST_ATTEMPT, RETRY_PAUSE
from consensus_backends.etcd.client import EtcdClient
from consensus_backends.etcd.errors import interrupted, translate
from consensus_backends.etcd.storage import Steps, StorageSteps

T = TypeVar("T")


class AsyncStorage:
    """``consensus_api.backend.AsyncStorage`` for etcd; made and used on one event loop."""

    def __init__(self, client: EtcdClient, steps: StorageSteps, request_timeout: float) -> None:
        self._client = client
        self._calls = client.calls
        self._steps = steps
        self._timeout = request_timeout
        self._loop = asyncio.get_running_loop()
        self._channels: dict[tuple[str, int], tuple[grpc.aio.Channel, Any, Any]] = {}
        self._in_flight: set[Any] = set()
        self._interrupted: set[Any] = set()
        self._closed = False
        self._stop_listening = self._calls.on_trouble(self._trouble_began)

    async def fetch(self, key: str) -> Versioned | None:
        """See ``StorageSteps.fetch``."""
        return await self._drive(self._steps.fetch(key))

    async def put(self, key: str, value: bytes, fence: Leadership | None) -> int:
        """See ``StorageSteps.put``."""
        return await self._drive(self._steps.put(key, value, fence))

    async def update(self, key: str, value: bytes, version: int | None, fence: Leadership | None) -> int:
        """See ``StorageSteps.update``."""
        return await self._drive(self._steps.update(key, value, version, fence))

    async def delete(self, key: str, version: int | None, fence: Leadership | None) -> None:
        """See ``StorageSteps.delete``."""
        await self._drive(self._steps.delete(key, version, fence))

    async def keys(self, namespace: str) -> frozenset[str]:
        """See ``StorageSteps.keys``."""
        return await self._drive(self._steps.keys(namespace))

    async def aclose(self) -> None:
        """Close the channels; calls in flight fail. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._stop_listening()
        channels, self._channels = list(self._channels.values()), {}
        for channel, _, _ in channels:
            await channel.close()

    async def _drive(self, steps: Steps[T]) -> T:
        """Run ``steps`` with awaited calls, all within one ``request_timeout``."""
        deadline = time.monotonic() + self._timeout
        try:
            request = next(steps)
            while True:
                try:
                    if isinstance(request, etcdrpc.RangeRequest):
                        response = await self._call("a read", _kv_range, request, deadline, retry=True)
                        self._client.note_read(response)
                    else:
                        response = await self._call("a transaction", _kv_txn, request, deadline, retry=False)
                except ConsensusError as exc:
                    request = steps.throw(exc)
                else:
                    request = steps.send(response)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]

    async def _call(
        self,
        what: str,
        method: Callable[[Any, Any], Any],
        request: Any,
        deadline: float,
        *,
        retry: bool,
        authenticated: bool = True,
    ) -> Any:
        """Send ``request`` until an attempt succeeds or fails for good (``RetryingCalls.call``'s
        rules); ``method(kv_stub, auth_stub)`` picks the call."""
        attempt = FIRST_ATTEMPT
        reauthenticate = authenticated
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise OperationTimeoutError(f"etcd did not complete {what} in time")
            if self._closed:
                raise SessionLostError("the etcd connection is closed")
            address = self._calls.address()
            if address is None:  # every endpoint failed a moment ago
                if self._calls.troubled:
                    raise OperationTimeoutError(f"no etcd endpoint is reachable for {what}")
                await asyncio.sleep(min(RETRY_PAUSE, remaining))
                continue
            _, kv, auth = self._stubs(address)
            timeout = min(remaining, attempt) if retry and self._calls.failover else remaining
            metadata = self._calls.metadata if authenticated else None
            call: Any = None
            try:
                call = method(kv, auth)(request, timeout=timeout, metadata=metadata)
                self._in_flight.add(call)
                return await call
            except asyncio.CancelledError:
                if call in self._interrupted:  # trouble began, not the caller's cancellation
                    raise interrupted(what) from None
                raise
            except grpc.aio.UsageError:  # a channel closed by ``aclose``
                raise SessionLostError("the etcd connection is closed") from None
            except grpc.RpcError as exc:
                cut_short = timeout < remaining
                if self._calls.after_failure(exc, what, retry=retry, cut_short=cut_short, single=False):
                    if reauthenticate and self._calls.user is not None:
                        reauthenticate = False  # the token expired; the call was refused, not applied
                        await self._authenticate(deadline)
                        continue
                    raise translate(exc, what) from None
                attempt *= 2
                await asyncio.sleep(max(min(RETRY_PAUSE, deadline - time.monotonic()), 0))
            finally:
                self._in_flight.discard(call)
                self._interrupted.discard(call)

    async def _authenticate(self, deadline: float) -> None:
        """A new auth token for every call of the connection (``RetryingCalls.authenticate``)."""
        request = self._calls.credentials()
        try:
            response = await self._call(
                "authentication", _authenticate, request, deadline, retry=True, authenticated=False
            )
        except ConsensusError as exc:
            self._calls.refused(exc)
            return
        self._calls.use_token(response.token)

    def _stubs(self, address: tuple[str, int]) -> tuple[grpc.aio.Channel, Any, Any]:
        """The channel to ``address`` and its KV and Auth stubs, opened at the first call there."""
        stubs = self._channels.get(address)
        if stubs is None:
            channel = self._calls.open_aio_channel(address)
            stubs = self._channels[address] = (channel, etcdrpc.KVStub(channel), etcdrpc.AuthStub(channel))
        return stubs

    def _trouble_began(self) -> None:
        """From the thread that reports trouble: end every call in flight (on the loop)."""
        with contextlib.suppress(RuntimeError):  # the loop is closed: nothing is in flight
            self._loop.call_soon_threadsafe(self._interrupt)

    def _interrupt(self) -> None:
        for call in list(self._in_flight):
            self._interrupted.add(call)
            call.cancel()


def _kv_range(kv: Any, auth: Any) -> Any:
    return kv.Range


def _kv_txn(kv: Any, auth: Any) -> Any:
    return kv.Txn


def _authenticate(kv: Any, auth: Any) -> Any:
    return auth.Authenticate
