"""What both coordinators (:class:`~.core.Coordinator`, :class:`~.incremental.IncrementalCoordinator`)
share: the member's thread, its session's state changes, the bounded wait of
``ensure_active_group``, and ``close``.

A member is attached to its session from ``session.coordinator`` (or
``session.incremental_coordinator``) until ``close``, which detaches it and
stops its thread; the thread runs ``_finish`` (leaving the group) before it
ends. Every wait has a bound.
"""

from __future__ import annotations

import threading
import time
from abc import abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from consensus_api.closing import Closing
from consensus_api.config import CALL_TIMEOUT
from consensus_api.coordinator.generic.loop import StepThread
from consensus_api.errors import ConfigurationError, ConsensusError, OperationTimeoutError, SessionLostError
from consensus_api.keys import check_key
from consensus_api.model import SessionState

if TYPE_CHECKING:
    from consensus_api._session_port import SessionPort

#: Seconds a member may take to rejoin during a rebalance before the group goes on without it.
DEFAULT_REBALANCE_TIMEOUT = 30.0
T = TypeVar("T")


class GroupMember(Closing):
    """One member of ``group``, stepped on its own thread ``consensus-coordinator-<group>``."""

    def __init__(self, session: SessionPort, group: str, rebalance_timeout: float | None) -> None:
        self.group = check_key(group, "group name")
        self.rebalance_timeout = _positive("rebalance_timeout", rebalance_timeout, DEFAULT_REBALANCE_TIMEOUT)
        self._session = session
        self._cond = threading.Condition()
        self._states: list[SessionState] = []
        self._error: ConsensusError | None = None
        self._thread = StepThread(f"consensus-coordinator-{group}", self._step, self._finish)

    def close(self, timeout: float | None = None) -> None:
        """Detach from the session and stop: the member's thread leaves the group (``_finish``).
        Idempotent; waits at most ``timeout`` (default: the session's ``request_timeout`` + 2 s)."""
        self._session.remove_state_listener(self._on_state)
        self._session.detach(self)
        bound = self._session.settings.request_timeout + 2 if timeout is None else timeout
        self._thread.stop(bound if self._thread.started else 0)
        with self._cond:
            self._cond.notify_all()

    @abstractmethod
    def _step(self) -> float:
        """One step on the member's thread; returns the seconds until the next at the latest."""

    @abstractmethod
    def _finish(self) -> None:
        """Leave the group, on the member's thread, once it stops."""

    def _await(self, ready: Callable[[], T | None], timeout: float | None, goal: str) -> T:
        """Start the member's thread, then wait (holding ``_cond``) until ``ready()`` gives a value.

        Raises the member's fatal error, ``SessionLostError`` once closed, and
        ``OperationTimeoutError`` after ``timeout`` seconds (default: ``rebalance_timeout`` plus the
        session's ``request_timeout``); a callback of this member may not wait (``ConsensusError``).
        """
        if self._thread.current():
            raise ConsensusError("ensure_active_group cannot be called from a coordinator callback")
        if timeout is None:
            bound = self.rebalance_timeout + self._session.settings.request_timeout
        else:
            bound = _positive("timeout", timeout, 0.0)
        deadline = time.monotonic() + bound
        if self._thread.stopping:
            raise self._error or self._closed()
        self._thread.start()
        with self._cond:
            while True:
                if self._error is not None:
                    raise self._error
                if self._thread.stopping:
                    raise self._closed()
                value = ready()
                if value is not None:
                    return value
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise OperationTimeoutError(f"group {self.group!r} did not {goal} in {bound:.1f}s")
                self._cond.wait(min(remaining, 0.1))

    def _on_state(self, state: SessionState) -> None:
        """A session state change, queued for the member's thread (registered by the subclass)."""
        with self._cond:
            self._states.append(state)
        self._thread.wake()

    def _take_states(self) -> list[SessionState]:
        """The session state changes since the last call, oldest first."""
        with self._cond:
            states, self._states = self._states, []
        return states

    def _closed(self) -> SessionLostError:
        return SessionLostError(f"the coordinator of group {self.group!r} is closed")


def _positive(name: str, value: float | None, default: float) -> float:
    """``value`` (``default`` for None) if it is a number of seconds from 0.01 to ``MAX_SECONDS``,
    else ``ConfigurationError`` naming the argument ``name``."""
    if value is None:
        return default
    if not isinstance(value, int | float):
        raise ConfigurationError(f"{name}: expected a number of seconds, got {value!r}")
    try:
        return CALL_TIMEOUT(value)
    except ValueError as exc:
        raise ConfigurationError(f"{name}: {exc}") from None
