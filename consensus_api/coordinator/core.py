"""The Coordinator (SPEC section 8, KIP-795): one member of a group that rebalances.

Register with protocol metadata, one member is chosen leader and assigns, every
member receives its assignment: Kafka's rebalance protocol as an API. The
engine below (Kafka's own protocol, or the generic one on storage, membership
and election) is picked by the backend; the observable behaviour is the same.

Guarantees:

* Every handler callback runs on this coordinator's thread,
  ``consensus-coordinator-<group>``, one at a time, in protocol order; never on
  a client I/O thread or the session's dispatcher thread.
* ``on_join_prepare`` runs once before every join, with the generation still
  held, or ``(-1, "")`` on the first join and once the membership was lost
  (session loss, fenced out of a generation) - then everything held must go.
* ``on_join_complete`` never runs twice without an ``on_join_prepare`` between:
  a member never holds two generations' assignments.
* ``on_leave_prepare`` runs once, on ``close``, if the member had registered.
* No call blocks past its timeout.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any

from consensus_api.coordinator.engine import CoordinatorEngine, EngineHost, Protocols
from consensus_api.coordinator.handler import CoordinatorHandler, Generation
from consensus_api.coordinator.loop import StepThread
from consensus_api.errors import (
    ConfigurationError,
    ConsensusError,
    InconsistentGroupProtocolError,
    InvalidTypeError,
    OperationTimeoutError,
    SessionLostError,
)
from consensus_api.keys import check_key, check_segment
from consensus_api.model import SessionState

if TYPE_CHECKING:
    from consensus_api.session import Session

log = logging.getLogger("consensus_api.coordinator")

#: Seconds a member may take to rejoin during a rebalance before the group goes on without it.
DEFAULT_REBALANCE_TIMEOUT = 30.0
HANDLER_METHODS = (
    "metadata",
    "on_join_prepare",
    "perform_assignment",
    "on_join_complete",
    "on_leave_prepare",
)
FATAL = (InconsistentGroupProtocolError, ConfigurationError, InvalidTypeError)


class Coordinator(EngineHost):
    """A member of ``group`` taking part in its rebalances; see ``session.coordinator``."""

    def __init__(
        self,
        session: Session,
        group: str,
        protocol_type: str,
        handler: CoordinatorHandler,
        *,
        rebalance_timeout: float | None = None,
    ) -> None:
        self.group = check_key(group, "group name")
        self.protocol_type = check_segment(protocol_type, "protocol type")
        missing = [name for name in HANDLER_METHODS if not callable(getattr(handler, name, None))]
        if missing:
            raise InvalidTypeError(f"the handler lacks {', '.join(missing)} (see CoordinatorHandler)")
        self.rebalance_timeout = _positive(rebalance_timeout, DEFAULT_REBALANCE_TIMEOUT)
        self._session = session
        self._handler = handler
        self._cond = threading.Condition()
        self._generation: Generation | None = None
        self._prepared = False
        self._registered = False
        self._error: ConsensusError | None = None
        self._states: list[SessionState] = []
        self._thread = StepThread(f"consensus-coordinator-{group}", self._step, self._finish)
        backend = session._backend_for_call()
        engine = backend.coordinator_engine(self.group, self.protocol_type, self, self.rebalance_timeout)
        self._engine = engine if engine is not None else default_engine(session, self)
        session.add_state_listener(self._on_state)

    # The public interface

    def ensure_active_group(self, timeout: float | None = None) -> Generation:
        """Join if not yet joined, then wait until this member holds a stable generation.

        Waits at most ``timeout`` seconds (default: ``rebalance_timeout`` plus the session's
        ``request_timeout``), then raises ``OperationTimeoutError``. Raises
        ``InconsistentGroupProtocolError`` if the member shares no protocol with the group,
        ``SessionLostError`` once closed.
        """
        if self._thread.current():
            raise ConsensusError("ensure_active_group cannot be called from a coordinator callback")
        bound = (
            self.rebalance_timeout + self._session.settings.request_timeout if timeout is None else timeout
        )
        deadline = time.monotonic() + _positive(bound, bound)
        if self._thread.stopping:
            raise SessionLostError(f"the coordinator of group {self.group!r} is closed")
        self._thread.start()
        with self._cond:
            while True:
                if self._error is not None:
                    raise self._error
                if self._thread.stopping:
                    raise SessionLostError(f"the coordinator of group {self.group!r} is closed")
                stable = self._stable()
                if stable is not None:
                    return stable
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise OperationTimeoutError(f"group {self.group!r} did not become stable in {bound:.1f}s")
                self._cond.wait(min(remaining, 0.1))

    def generation(self) -> Generation | None:
        """The generation this member holds (also while a rebalance is under way), or None."""
        with self._cond:
            return self._generation

    def generation_if_stable(self) -> Generation | None:
        """The generation this member holds if no rebalance is pending or under way, else None."""
        with self._cond:
            return self._stable()

    def member_id(self) -> str:
        """This member's id in the group ('' before it has one)."""
        return self._engine.member_id()

    def request_rejoin(self) -> None:
        """Ask for a rebalance (the follow-up round of the cooperative protocol)."""
        self._engine.request_rejoin()
        self._thread.wake()

    def close(self, timeout: float | None = None) -> None:
        """``on_leave_prepare``, then leave the group. Idempotent; waits at most ``timeout``."""
        self._session.remove_state_listener(self._on_state)
        self._session._detach(self)
        bound = self._session.settings.request_timeout + 2 if timeout is None else timeout
        if not self._thread.started:
            self._thread.stop(0)
            return
        self._thread.stop(bound)
        with self._cond:
            self._cond.notify_all()

    def __enter__(self) -> Coordinator:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Coordinator {self.group!r} {self._generation}>"

    # EngineHost: called by the engine on the coordinator thread

    def protocols(self) -> Protocols:
        return _checked_protocols(self._handler.metadata())

    def rejoin(self) -> Protocols:
        with self._cond:
            prepared, self._prepared = self._prepared, True
            held = self._generation
        if not prepared:
            self._call("on_join_prepare", held.generation_id if held else -1, held.member_id if held else "")
        return self.protocols()

    def assign(self, leader_id: str, protocol: str, members: Mapping[str, bytes]) -> dict[str, bytes] | None:
        try:
            result = self._handler.perform_assignment(leader_id, protocol, dict(members))
            return {member: _checked_assignment(result.get(member, b""), member) for member in members}
        except Exception:
            log.exception("perform_assignment of group %r failed; retrying", self.group)
            return None

    def complete(self, generation: Generation, assignment: bytes) -> None:
        with self._cond:
            unprepared = not self._prepared and self._generation is not None
        if unprepared:  # an engine may not skip the prepare; keep the guarantee regardless
            self.rejoin()
        self._call(
            "on_join_complete",
            generation.generation_id,
            generation.member_id,
            generation.protocol_name,
            assignment,
        )
        with self._cond:
            self._generation = generation
            self._prepared = False
            self._cond.notify_all()

    def lost(self) -> None:
        with self._cond:
            held, self._generation = self._generation, None
            if held is not None:
                self._prepared = True
        if held is not None:
            self._call("on_join_prepare", -1, "")

    def fail(self, error: ConsensusError) -> None:
        with self._cond:
            self._error = error
            self._cond.notify_all()
        self._thread.stop(0)

    def wake(self) -> None:
        self._thread.wake()

    # The coordinator thread

    def _step(self) -> float:
        with self._cond:
            states, self._states = self._states, []
        try:
            for state in states:
                self._engine.session_state(state)
            if not self._registered:
                self._engine.start()
                self._registered = True
            delay = self._engine.step()
        except FATAL as exc:
            self.fail(exc)
            return 1.0
        with self._cond:
            self._cond.notify_all()
        return delay

    def _finish(self) -> None:
        deadline = time.monotonic() + self._session.settings.request_timeout
        if self._registered:
            self._call("on_leave_prepare")
        try:
            self._engine.close(deadline)
        finally:
            with self._cond:
                self._generation = None
                self._cond.notify_all()

    def _stable(self) -> Generation | None:
        if self._prepared or self._generation is None or self._engine.rebalancing():
            return None
        return self._generation

    def _on_state(self, state: SessionState) -> None:
        with self._cond:
            self._states.append(state)
        self._thread.wake()

    def _call(self, name: str, *args: Any) -> None:
        callback: Callable[..., object] = getattr(self._handler, name)
        try:
            callback(*args)
        except Exception:
            log.exception("%s of group %r raised; the protocol goes on", name, self.group)


def default_engine(session: Session, coordinator: Coordinator) -> CoordinatorEngine:
    """The generic engine (storage, membership and election of ``session``)."""
    from consensus_api.coordinator.generic import GenericEngine  # noqa: PLC0415 - avoids an import cycle

    return GenericEngine(
        session, coordinator.group, coordinator.protocol_type, coordinator, coordinator.rebalance_timeout
    )


def _positive(value: float | None, default: float) -> float:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ConfigurationError(f"expected a positive number of seconds, got {value!r}")
    return float(value)


def _checked_protocols(protocols: Any) -> Protocols:
    checked: Protocols = []
    try:
        for name, metadata in protocols:
            check_segment(name, "protocol name")
            if not isinstance(metadata, bytes):
                raise InvalidTypeError(f"metadata of protocol {name!r} must be bytes")
            checked.append((name, metadata))
    except (TypeError, ValueError) as exc:
        raise InvalidTypeError(f"metadata() must return (name, bytes) pairs: {exc}") from None
    names = [name for name, _ in checked]
    if not names or len(set(names)) != len(names):
        raise InvalidTypeError(f"metadata() must name at least one protocol, each once; got {names}")
    return checked


def _checked_assignment(value: Any, member: str) -> bytes:
    if not isinstance(value, bytes):
        raise InvalidTypeError(f"the assignment of {member!r} must be bytes, not {type(value).__name__}")
    return value
