"""Versioned key-value storage (KIP-30 Storage).

Contract: <https://consensus-api.github.io/consensus-api/spec/#4-storage-kip-30-storage>
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

from consensus_api._session_port import SessionPort
from consensus_api.backend import AsyncStorage, Reader, WouldBlock, Writer
from consensus_api.errors import FencedError, InvalidTypeError, SessionLostError
from consensus_api.keys import (
    check_int,
    check_key,
    check_namespace,
    check_segment,
    check_value,
    check_version,
)
from consensus_api.lock import Lease, lease_fence
from consensus_api.model import Leadership, SessionState, Versioned

T = TypeVar("T")


class Storage:
    """Linearizable storage: a completed write is seen by every later ``fetch``.

    Every argument is checked before any I/O. Versions strictly increase per
    key, also across delete and re-create. A write with ``fence=`` happens
    only if that leadership (or exclusive lock ``Lease``) is still current, atomically, else
    ``FencedError``.
    """

    def __init__(self, session: SessionPort) -> None:
        self._session = session

    def fetch(self, key: str) -> Versioned | None:
        """The value and version of ``key``, or None if it does not exist."""
        return self._session.backend_for_call().fetch(check_key(key))

    def fetch_nowait(self, key: str) -> Versioned | None:
        """``fetch`` answered on the calling thread without waiting on a lock, a connection, another
        process or the network, or ``WouldBlock`` (nothing was done: call ``fetch``) where the
        backend cannot promise that (``Backend.nowait_reader``). For event loops: ``consensus_api.aio``
        uses it. ``key`` is checked first."""
        key = check_key(key)
        return self._nowait().fetch(key)

    def keys_nowait(self, namespace: str = "") -> frozenset[str]:
        """``keys`` answered without waiting, or ``WouldBlock``, like ``fetch_nowait``."""
        namespace = check_namespace(namespace)
        return self._nowait().keys(namespace)

    @property
    def can_read_nowait(self) -> bool:
        """Whether ``fetch_nowait`` and ``keys_nowait`` can answer at all (the backend has a
        ``nowait_reader``); False: they always raise ``WouldBlock``. Does no I/O."""
        return self._session.backend_for_call().nowait_reader() is not None

    @property
    def can_write_nowait(self) -> bool:
        """Whether ``put_nowait``, ``update_nowait`` and ``delete_nowait`` can answer at all (the
        backend has a ``nowait_writer``); False: they always raise ``WouldBlock``. Does no I/O."""
        return self._session.backend_for_call().nowait_writer() is not None

    def _nowait(self) -> Reader:
        reader = self._session.backend_for_call().nowait_reader()
        if reader is None:
            raise WouldBlock("this backend has no reads that never wait")
        return reader

    def put_nowait(self, key: str, value: bytes, *, fence: Leadership | Lease | None = None) -> int:
        """``put`` done on the calling thread without waiting on a lock, a connection, another process
        or the network, or ``WouldBlock`` (nothing was done: call ``put``) where the backend cannot
        promise that (``Backend.nowait_writer``: SQLite, when the write lock is free). Arguments
        are checked first; results and errors are ``put``'s. For event loops: ``consensus_api.aio``
        uses it, like the two below."""
        args = put_args(key, value, fence)
        return self._write(args[-1], lambda: self._nowait_writer().put(*args))

    def update_nowait(
        self, key: str, value: bytes, *, version: int | None = None, fence: Leadership | Lease | None = None
    ) -> int:
        """``update`` without waiting, or ``WouldBlock``, like ``put_nowait``."""
        args = update_args(key, value, version, fence)
        return self._write(args[-1], lambda: self._nowait_writer().update(*args))

    def delete_nowait(
        self, key: str, *, version: int | None = None, fence: Leadership | Lease | None = None
    ) -> None:
        """``delete`` without waiting, or ``WouldBlock``, like ``put_nowait``."""
        args = delete_args(key, version, fence)
        self._write(args[-1], lambda: self._nowait_writer().delete(*args))

    def _nowait_writer(self) -> Writer:
        writer = self._session.backend_for_call().nowait_writer()
        if writer is None:
            raise WouldBlock("this backend has no writes that never wait")
        return writer

    def put(self, key: str, value: bytes, *, fence: Leadership | Lease | None = None) -> int:
        """Create ``key``; ``KeyExistsError`` if it exists. Returns the new version."""
        backend = self._session.backend_for_call()
        args = put_args(key, value, fence)
        return self._write(args[-1], lambda: backend.put(*args))

    def update(
        self, key: str, value: bytes, *, version: int | None = None, fence: Leadership | Lease | None = None
    ) -> int:
        """Replace the value of ``key``, if at ``version`` when given. Returns the new version."""
        backend = self._session.backend_for_call()
        args = update_args(key, value, version, fence)
        return self._write(args[-1], lambda: backend.update(*args))

    def delete(
        self, key: str, *, version: int | None = None, fence: Leadership | Lease | None = None
    ) -> None:
        """Remove ``key``, if at ``version`` when given."""
        backend = self._session.backend_for_call()
        args = delete_args(key, version, fence)
        self._write(args[-1], lambda: backend.delete(*args))

    def _write(self, fence: Leadership | None, write: Callable[[], T]) -> T:
        """Run ``write``; ``FencedError`` where it failed because this session lost the fence's
        candidacy (``fenced_by_loss``)."""
        try:
            return write()
        except SessionLostError:
            fenced = fenced_by_loss(self._session, fence)
            if fenced is None:
                raise
            raise fenced from None

    def keys(self, namespace: str = "") -> frozenset[str]:
        """The keys that exist exactly one level below ``namespace``."""
        return self._session.backend_for_call().keys(check_namespace(namespace))

    def walk(self, namespace: str = "") -> Iterator[tuple[str, Versioned]]:
        """Every key at any depth below ``namespace`` (``""``: all keys) with its value, streamed in pages.

        Not atomic: each ``(key, Versioned)`` is the key's state at its read,
        which is linearizable (some moment between the call and the yield). No
        key is yielded twice; a key that exists throughout the walk is yielded;
        keys written meanwhile may or may not be. ``namespace`` itself is not
        yielded. Each page is bounded by ``request_timeout``; order is unspecified.
        """
        backend = self._session.backend_for_call()
        return backend.walk(check_namespace(namespace))


class NativeStorage:
    """``Storage``'s calls awaited on one event loop through the backend's own asyncio face
    (``Backend.async_storage``): the same closed-session check, argument checks, fence handling,
    telemetry (the session's ``async_storage``) and errors as ``Storage``, by the same functions;
    no thread is involved and nothing caps the calls in flight."""

    def __init__(self, session: SessionPort, face: AsyncStorage) -> None:
        self._session = session
        self._face = face

    async def fetch(self, key: str) -> Versioned | None:
        """As ``Storage.fetch``."""
        self._session.backend_for_call()  # SessionLostError once closed, as Storage's calls
        return await self._face.fetch(check_key(key))

    async def put(self, key: str, value: bytes, fence: Leadership | Lease | None) -> int:
        """As ``Storage.put``."""
        self._session.backend_for_call()
        args = put_args(key, value, fence)
        return await self._write(args[-1], self._face.put(*args))

    async def update(
        self, key: str, value: bytes, version: int | None, fence: Leadership | Lease | None
    ) -> int:
        """As ``Storage.update``."""
        self._session.backend_for_call()
        args = update_args(key, value, version, fence)
        return await self._write(args[-1], self._face.update(*args))

    async def delete(self, key: str, version: int | None, fence: Leadership | Lease | None) -> None:
        """As ``Storage.delete``."""
        self._session.backend_for_call()
        args = delete_args(key, version, fence)
        await self._write(args[-1], self._face.delete(*args))

    async def keys(self, namespace: str) -> frozenset[str]:
        """As ``Storage.keys``."""
        self._session.backend_for_call()
        return await self._face.keys(check_namespace(namespace))

    async def aclose(self) -> None:
        """Release the face's connections (after the session closed). Idempotent."""
        await self._face.aclose()

    async def _write(self, fence: Leadership | None, write: Coroutine[Any, Any, T]) -> T:
        """Await ``write``, with ``Storage._write``'s translation of a lost candidacy."""
        try:
            return await write
        except SessionLostError:
            fenced = fenced_by_loss(self._session, fence)
            if fenced is None:
                raise
            raise fenced from None


def native_storage(storage: Storage) -> NativeStorage | None:
    """``storage``'s calls through its backend's asyncio face for the running event loop (call it
    on that loop), or None where the backend offers none. No I/O."""
    face = storage._session.async_storage()
    return None if face is None else NativeStorage(storage._session, face)


def put_args(key: str, value: bytes, fence: Any) -> tuple[str, bytes, Leadership | None]:
    """``put``'s arguments checked, as the backend receives them (a ``Lease`` as its fence)."""
    return check_key(key), check_value(value), _check_fence(fence)


def update_args(
    key: str, value: bytes, version: int | None, fence: Any
) -> tuple[str, bytes, int | None, Leadership | None]:
    """``update``'s arguments checked, as the backend receives them."""
    return check_key(key), check_value(value), check_version(version), _check_fence(fence)


def delete_args(key: str, version: int | None, fence: Any) -> tuple[str, int | None, Leadership | None]:
    """``delete``'s arguments checked, as the backend receives them."""
    return check_key(key), check_version(version), _check_fence(fence)


def fenced_by_loss(session: SessionPort, fence: Leadership | None) -> FencedError | None:
    """What a write fenced by ``fence`` that raised ``SessionLostError`` raises instead: ``FencedError``
    where this session held the fence's candidacy, since a lost session's candidacies are void
    (<https://consensus-api.github.io/consensus-api/spec/#3-session>) and such a write was not
    applied (backend SPI); None (the ``SessionLostError`` stands) otherwise or once closed."""
    if fence is None or session.state is SessionState.CLOSED:
        return None
    if not session.holds_candidacy(fence.service, fence.leader_id):
        return None
    return FencedError(
        f"the session holding the leadership of {fence.service!r} (term {fence.term}) was lost"
    )


def _check_fence(fence: Any) -> Leadership | None:
    """The leadership a write is fenced by: ``fence`` itself, or the one an exclusive lease stands for,
    its fields checked (a service name, a candidate id, a term from 0 to 2**63-1)."""
    if isinstance(fence, Lease):
        fence = lease_fence(fence)
    if fence is None:
        return None
    if not isinstance(fence, Leadership):
        raise InvalidTypeError(
            f"fence must be a Leadership, an exclusive Lease or None, not {type(fence).__name__}"
        )
    check_key(fence.service, "fence service")
    check_segment(fence.leader_id, "fence leader id")
    check_int(fence.term, "fence term", 0)
    return fence
