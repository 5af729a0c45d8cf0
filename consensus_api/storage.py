"""Versioned key-value storage (KIP-30 Storage).

Contract: <https://consensus-api.github.io/consensus-api/spec/#4-storage-kip-30-storage>
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from consensus_api._session_port import SessionPort
from consensus_api.backend import Reader, WouldBlock, Writer
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
        args = check_key(key), check_value(value), (leadership := _check_fence(fence))
        return self._write(leadership, lambda: self._nowait_writer().put(*args))

    def update_nowait(
        self, key: str, value: bytes, *, version: int | None = None, fence: Leadership | Lease | None = None
    ) -> int:
        """``update`` without waiting, or ``WouldBlock``, like ``put_nowait``."""
        args = check_key(key), check_value(value), check_version(version), (leadership := _check_fence(fence))
        return self._write(leadership, lambda: self._nowait_writer().update(*args))

    def delete_nowait(
        self, key: str, *, version: int | None = None, fence: Leadership | Lease | None = None
    ) -> None:
        """``delete`` without waiting, or ``WouldBlock``, like ``put_nowait``."""
        args = check_key(key), check_version(version), (leadership := _check_fence(fence))
        self._write(leadership, lambda: self._nowait_writer().delete(*args))

    def _nowait_writer(self) -> Writer:
        writer = self._session.backend_for_call().nowait_writer()
        if writer is None:
            raise WouldBlock("this backend has no writes that never wait")
        return writer

    def put(self, key: str, value: bytes, *, fence: Leadership | Lease | None = None) -> int:
        """Create ``key``; ``KeyExistsError`` if it exists. Returns the new version."""
        backend = self._session.backend_for_call()
        args = check_key(key), check_value(value), (leadership := _check_fence(fence))
        return self._write(leadership, lambda: backend.put(*args))

    def update(
        self, key: str, value: bytes, *, version: int | None = None, fence: Leadership | Lease | None = None
    ) -> int:
        """Replace the value of ``key``, if at ``version`` when given. Returns the new version."""
        backend = self._session.backend_for_call()
        args = check_key(key), check_value(value), check_version(version), (leadership := _check_fence(fence))
        return self._write(leadership, lambda: backend.update(*args))

    def delete(
        self, key: str, *, version: int | None = None, fence: Leadership | Lease | None = None
    ) -> None:
        """Remove ``key``, if at ``version`` when given."""
        backend = self._session.backend_for_call()
        args = check_key(key), check_version(version), (leadership := _check_fence(fence))
        self._write(leadership, lambda: backend.delete(*args))

    def _write(self, fence: Leadership | None, write: Callable[[], T]) -> T:
        """Run ``write``; ``FencedError`` where it failed because this session, the holder of the
        fence's candidacy, was lost: a lost session's candidacies are void (<https://consensus-api.github.io/consensus-api/spec/#3-session>),
        and a write that raised ``SessionLostError`` was not applied (backend SPI)."""
        try:
            return write()
        except SessionLostError:
            session = self._session
            if fence is None or session.state is SessionState.CLOSED:
                raise
            if not session.holds_candidacy(fence.service, fence.leader_id):
                raise
            raise FencedError(
                f"the session holding the leadership of {fence.service!r} (term {fence.term}) was lost"
            ) from None

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
