"""tooz's ``Lock`` on a fenced lock of this API (``consensus_api.lock``)."""

from __future__ import annotations

import threading
from collections.abc import Callable

import tooz
import tooz.locking

from consensus_api.errors import KeyExistsError, KeyNotFoundError, VersionConflictError
from consensus_api.keys import join_key
from consensus_api.lock import Lease, Lock
from consensus_api.session import Session
from consensus_api.tooz_driver._plumbing import translated

#: Where each tooz lock's epoch lives (a decimal counter; absent: 0). ``break_`` starts a new epoch.
EPOCHS = "_tooz/lock-epochs"


class ConsensusLock(tooz.locking.Lock):
    """A tooz lock whose every acquisition is a fenced ``consensus_api`` lease (``lease``).

    Exclusive and shared (``acquire(shared=True)``); one object may hold several
    shared leases. Waiters are served in arrival order. ``break_`` starts a new
    epoch of the lock: holders and waiters of the old epoch keep their (now
    separate) lock and their ``release`` returns False; tokens are comparable
    within one epoch only.
    """

    def __init__(self, session: Callable[[], Session], name: bytes) -> None:
        """``session`` returns the driver's open session (``ToozConnectionError`` if there is none)."""
        super().__init__(name)
        self._session = session
        self._encoded = name.hex()
        self._mutex = threading.Lock()
        self._held: list[tuple[Lock, int]] = []

    @property
    def lease(self) -> Lease | None:
        """The lease of this object's latest acquisition still held (pass it as ``fence=``), or None."""
        with self._mutex:
            return self._held[-1][0].lease if self._held else None

    def acquire(
        self, blocking: bool = True, shared: bool = False, timeout: int | float | None = None
    ) -> bool:
        """Acquire; ``blocking`` may be a number of seconds (tooz's convention), else ``timeout`` bounds
        a blocking wait."""
        if not isinstance(blocking, bool):
            blocking, timeout = True, blocking
        with translated():
            epoch = self._epoch()
            lock = self._session().lock(f"_tooz/locks/{self._encoded}/{epoch}", shared=shared)
            if lock.acquire(timeout=timeout, blocking=blocking) is None:
                return False
        with self._mutex:
            self._held.append((lock, epoch))
        return True

    def release(self) -> bool:
        """Release this object's latest acquisition; False if it holds none, or the lock was broken or
        lost with the session meanwhile."""
        with self._mutex:
            if not self._held:
                return False
            lock, epoch = self._held.pop()
        with translated():
            lost = not lock.held
            lock.release()
            return not lost and self._epoch() == epoch

    def break_(self) -> bool:
        """Start a new epoch: the lock is free at once for new acquirers."""
        storage = self._session().storage
        key = join_key(EPOCHS, self._encoded)
        with translated():
            while True:
                current = storage.fetch(key)
                try:
                    if current is None:
                        storage.put(key, b"1")
                    else:
                        storage.update(key, str(int(current.value) + 1).encode(), version=current.version)
                except (KeyExistsError, KeyNotFoundError, VersionConflictError):
                    continue
                return True

    def _epoch(self) -> int:
        current = self._session().storage.fetch(join_key(EPOCHS, self._encoded))
        return 0 if current is None else int(current.value)
