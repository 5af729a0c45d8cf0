"""Fenced locks of an asyncio session: the twin of ``consensus_api.Lock``.

Contract: <https://consensus-api.github.io/consensus-api/spec/#7a-locks>
"""

from __future__ import annotations

import contextlib
from functools import partial
from types import TracebackType

from consensus_api.aio._bridge import EventStream
from consensus_api.aio._twin import SessionTwin, awaited
from consensus_api.errors import NotAMemberError
from consensus_api.lock import Lease, Lock, LockLost


def _give_back(lock: Lock, lease: Lease | None) -> None:
    """Release ``lease``, got by an acquire whose awaiting task was cancelled, if ``lock`` still
    holds it."""
    if lease is None or lock.lease != lease:
        return
    with contextlib.suppress(NotAMemberError):  # released meanwhile
        lock.release()


class AsyncLock(SessionTwin[Lock]):
    """A fenced lock for asyncio code: the synchronous ``Lock`` does the work, so the rules, leases
    and tokens are its own (pass a lease as ``fence=`` to ``AsyncStorage`` writes). ``async with
    lock as lease:`` acquires without a time limit and releases on exit.

    Cancelling an ``acquire`` that waits in line does not end its wait: it goes on, on its worker
    thread, for at most its ``timeout`` (or until the session closes), and a lease it then gets is
    released at once, so a cancelled acquire never leaves the lock held. Until it ended, this object
    is acquiring (another ``acquire`` raises ``MemberExistsError``): bound a wait with ``timeout``
    rather than a cancellation.
    """

    @property
    def name(self) -> str:
        """The lock's name."""
        return self._sync.name

    @property
    def shared(self) -> bool:
        """True for a shared (reader) lock."""
        return self._sync.shared

    @property
    def lease(self) -> Lease | None:
        """The lease this object holds, or None (also once its session was lost)."""
        return self._sync.lease

    @property
    def held(self) -> bool:
        """True while this object holds the lock and its session was not lost."""
        return self._sync.held

    acquire = awaited(Lock.acquire, undo=_give_back)
    release = awaited(Lock.release, write="release")

    def watch(self) -> EventStream[LockLost]:
        """A ``LockLost`` whenever a lease this object holds is lost with the session (none for the
        lease now: the stream starts on its first ``__anext__``); never coalesced away."""
        return self._loop.stream(self._sync.add_listener, self._sync.remove_listener, sticky=lambda _: True)

    async def __aenter__(self) -> Lease:
        lease = await self.acquire()
        assert lease is not None  # no time limit
        return lease

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self._loop.bridge.run(partial(self._sync.__exit__, kind, exc, tb), write="release")

    def __repr__(self) -> str:
        return f"<Async{repr(self._sync)[1:]}"
