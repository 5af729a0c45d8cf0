"""Versioned key-value storage (SPEC section 4, KIP-30 Storage)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from consensus_api.errors import InvalidTypeError
from consensus_api.keys import check_key, check_namespace, check_value, check_version
from consensus_api.model import Leadership, Versioned

if TYPE_CHECKING:
    from consensus_api.session import Session


class Storage:
    """Linearizable storage: a completed write is seen by every later ``fetch``.

    Every argument is checked before any I/O. Versions strictly increase per
    key, also across delete and re-create. A write with ``fence=`` happens
    only if that leadership is still current, atomically, else ``FencedError``.
    """

    def __init__(self, session: Session) -> None:
        self._session = session

    def fetch(self, key: str) -> Versioned | None:
        """The value and version of ``key``, or None if it does not exist."""
        return self._session._backend_for_call().fetch(check_key(key))

    def put(self, key: str, value: bytes, *, fence: Leadership | None = None) -> int:
        """Create ``key``; ``KeyExistsError`` if it exists. Returns the new version."""
        return self._session._backend_for_call().put(check_key(key), check_value(value), _check_fence(fence))

    def update(
        self, key: str, value: bytes, *, version: int | None = None, fence: Leadership | None = None
    ) -> int:
        """Replace the value of ``key``, if at ``version`` when given. Returns the new version."""
        return self._session._backend_for_call().update(
            check_key(key), check_value(value), check_version(version), _check_fence(fence)
        )

    def delete(self, key: str, *, version: int | None = None, fence: Leadership | None = None) -> None:
        """Remove ``key``, if at ``version`` when given."""
        self._session._backend_for_call().delete(check_key(key), check_version(version), _check_fence(fence))

    def keys(self, namespace: str = "") -> frozenset[str]:
        """The keys that exist exactly one level below ``namespace``."""
        return self._session._backend_for_call().keys(check_namespace(namespace))


def _check_fence(fence: Any) -> Leadership | None:
    if fence is not None and not isinstance(fence, Leadership):
        raise InvalidTypeError(f"fence must be a Leadership or None, not {type(fence).__name__}")
    return fence
