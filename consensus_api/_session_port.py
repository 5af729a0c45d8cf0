"""The one interface through which a session's storage, groups, elections and coordinators use it.

``Storage``, ``GroupMembership``, ``LeaderElection``, ``Lock`` and the coordinators hold a
``SessionPort``, never the ``Session`` itself: they see only what this protocol
names, and none of them imports the session module (which imports them).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from consensus_api.backend import AsyncStorage, Backend, Target
from consensus_api.config import Options
from consensus_api.model import SessionState


class SessionPort(Protocol):
    """A session as the objects it hands out see it. Every method is thread-safe."""

    @property
    def settings(self) -> Options:
        """The session's options."""

    @property
    def state(self) -> SessionState:
        """The session's current state."""

    def backend_for_call(self) -> Backend:
        """The backend, for one call; ``SessionLostError`` once the session is closed."""

    def async_storage(self) -> AsyncStorage | None:
        """The backend's asyncio storage for the running event loop (``Backend.async_storage``),
        timed and traced like ``backend_for_call``'s calls, or None where the backend has none."""

    def join(self, group: str, member_id: str, data: bytes, *, rejoin: bool = True) -> None:
        """Join ``group`` as ``member_id`` (checked) and track it: re-joined after a loss with
        ``auto_rejoin`` unless not ``rejoin`` (a lock's shared holder), released on close."""

    def leave(self, group: str, member_id: str) -> None:
        """Leave and stop tracking; ``NotAMemberError`` if this session has no such member."""

    def nominate(self, service: str, candidate_id: str, *, rejoin: bool = True) -> bool:
        """Stand for ``service`` (checked) and track the candidacy like a member (not ``rejoin``: a
        lock's place in line, never re-nominated after a loss); True if it leads."""

    def resign(self, service: str, candidate_id: str) -> None:
        """Resign and stop tracking; ``NotAMemberError`` if this session has no such candidate."""

    def holds_member(self, group: str, member_id: str) -> bool:
        """True while this session tracks the member ``member_id`` of ``group``."""

    def holds_candidacy(self, service: str, candidate_id: str) -> bool:
        """True while this session tracks the candidacy of ``candidate_id`` for ``service``."""

    def add_listener(self, target: Target, callback: Callable[[Any], None]) -> None:
        """Call ``callback`` on the dispatcher thread with ``target``'s state now and after every change."""

    def remove_listener(self, target: Target, callback: Callable[[Any], None]) -> None:
        """Stop calling ``callback`` for ``target``; unknown callbacks are ignored."""

    def add_state_listener(self, callback: Callable[[SessionState], None]) -> None:
        """Call ``callback(state)`` on the dispatcher thread at every state change."""

    def remove_state_listener(self, callback: Callable[[SessionState], None]) -> None:
        """Stop calling ``callback``; unknown callbacks are ignored."""

    def detach(self, coordinator: object) -> None:
        """Forget ``coordinator``: the session no longer closes it."""
