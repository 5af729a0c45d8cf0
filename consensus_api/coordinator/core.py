"""The Coordinator (KIP-795): one member of a group that rebalances.

Contract: <https://consensus-api.github.io/consensus-api/spec/#8-coordinator-kip-795--the-kafka-rebalance-protocol-as-an-api>

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
* ``on_join_complete`` never runs twice without an ``on_join_prepare`` between
  (a member never holds two generations' assignments), except that one that
  raised is called again with the same arguments until it returns (Kafka's
  AbstractCoordinator retries it too); meanwhile the generation is not stable
  and the member takes no other step of the protocol.
* ``on_leave_prepare`` runs once, on ``close``, if the member had registered.
* A static member (``group_instance_id``) takes part only while it holds its instance
  (:mod:`.instance`): a second start of the instance waits until the first one stopped everything
  and left, or lost its session; the first one, superseded, is fenced.
* No call blocks past its timeout.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from consensus_api.coordinator.engine import CoordinatorEngine, EngineHost, Protocols
from consensus_api.coordinator.generic.store_engine import GenericEngine
from consensus_api.coordinator.handler import (
    NO_GENERATION,
    CoordinatorHandler,
    Generation,
    require_callbacks,
)
from consensus_api.coordinator.instance import InstanceSeat
from consensus_api.coordinator.member import GroupMember
from consensus_api.errors import (
    ConfigurationError,
    ConsensusError,
    FencedError,
    InconsistentGroupProtocolError,
    InvalidTypeError,
)
from consensus_api.keys import check_segment
from consensus_api.model import SessionState

if TYPE_CHECKING:
    from consensus_api._session_port import SessionPort

log = logging.getLogger("consensus_api.coordinator")

HANDLER_METHODS = (
    "metadata",
    "on_join_prepare",
    "perform_assignment",
    "on_join_complete",
    "on_leave_prepare",
)
FATAL = (InconsistentGroupProtocolError, ConfigurationError, InvalidTypeError)
#: The first and the longest pause before calling a failed ``on_join_complete`` again.
RETRY_FIRST, RETRY_MAX = 0.1, 2.0
#: Seconds between two looks at a static member's seat while another start holds it (a change of the
#: seat or the claim wakes the member sooner).
SEAT_POLL = 1.0


class Coordinator(GroupMember, EngineHost):
    """A member of ``group`` taking part in its rebalances; see ``session.coordinator``.
    ``close`` runs ``on_leave_prepare`` (if it had registered), then leaves the group."""

    def __init__(
        self,
        session: SessionPort,
        group: str,
        protocol_type: str,
        handler: CoordinatorHandler,
        *,
        rebalance_timeout: float | None = None,
        group_instance_id: str | None = None,
    ) -> None:
        super().__init__(session, group, rebalance_timeout)
        self._instance = (
            None if group_instance_id is None else check_segment(group_instance_id, "instance id")
        )
        self.protocol_type = check_segment(protocol_type, "protocol type")
        require_callbacks(handler, HANDLER_METHODS, "handler", "CoordinatorHandler")
        self._handler = handler
        self._generation: Generation | None = None
        self._prepared = False
        self._registered = False
        self._completing: tuple[Generation, bytes] | None = None  # an on_join_complete that raised
        self._joined_with: Protocols | None = None  # the metadata of the last join
        self._recheck_metadata = False
        self._retry_delay = RETRY_FIRST
        backend = session.backend_for_call()
        engine = backend.coordinator_engine(self.group, self.protocol_type, self, self.rebalance_timeout)
        if engine is None:  # the generic engine, on the session's storage, membership and election
            engine = GenericEngine(session, self.group, self.protocol_type, self, self.rebalance_timeout)
        self._engine: CoordinatorEngine = engine
        self._seat = (
            None if self._instance is None else InstanceSeat(session, self.group, self._instance, self.wake)
        )
        session.add_state_listener(self._on_state)

    # The public interface

    def ensure_active_group(self, timeout: float | None = None) -> Generation:
        """Join if not yet joined, then wait until this member holds a stable generation.

        Waits at most ``timeout`` seconds (default: ``rebalance_timeout`` plus the session's
        ``request_timeout``), then raises ``OperationTimeoutError``. Raises
        ``InconsistentGroupProtocolError`` if the member shares no protocol with the group,
        ``SessionLostError`` once closed.
        """
        return self._await(self._stable, timeout, "become stable")

    def generation(self) -> Generation:
        """The generation this member is in: the one it holds (also while a rebalance is under way,
        and while its ``on_join_complete`` is being retried), or ``NO_GENERATION``."""
        with self._cond:
            return self._generation or NO_GENERATION

    def generation_if_stable(self) -> Generation | None:
        """The generation this member holds if no rebalance is pending or under way and its
        ``on_join_complete`` returned, else None."""
        with self._cond:
            return self._stable()

    def member_id(self) -> str:
        """This member's id in the group ('' before it has one)."""
        return self._engine.member_id()

    def request_rejoin(self) -> None:
        """Ask for a rebalance (the follow-up round of the cooperative protocol); asked while a join
        is under way (whose metadata may predate the request), a rebalance follows that join."""
        self._engine.request_rejoin()
        self._thread.wake()

    def update_metadata(self) -> None:
        """The handler's metadata may have changed (a new subscription): ask ``metadata()`` again,
        on the coordinator thread, and if it differs from what this member joined with, rebalance
        (exactly once). Returns at once."""
        with self._cond:
            self._recheck_metadata = True
        self._thread.wake()

    def __repr__(self) -> str:
        return f"<Coordinator {self.group!r} {self._generation}>"

    @property
    def session_port(self) -> SessionPort:
        """The session as this coordinator uses it (for the package's own readers)."""
        return self._session

    # EngineHost: called by the engine on the coordinator thread

    @property
    def group_instance_id(self) -> str | None:
        """This member's static identity (KIP-345), or None."""
        return self._instance

    def protocols(self) -> Protocols:
        return _checked_protocols(self._handler.metadata())

    def rejoin(self) -> Protocols:
        with self._cond:
            prepared, self._prepared = self._prepared, True
            held = self._generation
        if not prepared:
            self._call("on_join_prepare", held.generation_id if held else -1, held.member_id if held else "")
        with self._cond:  # cleared before metadata() runs: an update_metadata after it is kept
            self._recheck_metadata = False
        protocols = self.protocols()
        with self._cond:
            self._joined_with = protocols
        return protocols

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
        with self._cond:
            self._generation = generation
            self._completing = (generation, assignment)
            self._retry_delay = RETRY_FIRST
        self._retry_completion()

    def lost(self) -> None:
        with self._cond:
            held, self._generation = self._generation, None
            self._completing = None
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
        try:
            for state in self._take_states():
                self._engine.session_state(state)
                if state is SessionState.LOST and self._seat is not None:
                    self._seat.lost()
            if not self._holds_instance():
                return SEAT_POLL
            if self._completing is not None and not self._retry_completion():
                return self._retry_delay
            if not self._registered:
                self._engine.start()
                self._registered = True
            self._check_metadata()
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
            if self._seat is not None:
                self._seat.release()  # last: everything held was dropped and the group left
            with self._cond:
                self._generation = None
                self._cond.notify_all()

    def _holds_instance(self) -> bool:
        """True unless this is a static member waiting for its seat; a superseded one is fenced."""
        seat = self._seat
        if seat is None:
            return True
        if seat.superseded():
            self.lost()
            self.fail(
                FencedError(
                    f"FENCED_INSTANCE_ID: another member of group {self.group!r} started "
                    f"with group_instance_id {self._instance!r}"
                )
            )
            return False
        return seat.take()

    def _stable(self) -> Generation | None:
        if (
            self._prepared
            or self._completing is not None
            or self._generation is None
            or self._engine.rebalancing()
        ):
            return None
        return self._generation

    def _check_metadata(self) -> None:
        with self._cond:
            recheck, self._recheck_metadata = self._recheck_metadata, False
            joined = self._joined_with
        if recheck and joined is not None and self.protocols() != joined:
            self.request_rejoin()

    def _retry_completion(self) -> bool:
        """Call the pending ``on_join_complete``; True once it returned (the generation is held)."""
        with self._cond:
            pending = self._completing
        if pending is None:
            return True
        generation, assignment = pending
        if not self._call(
            "on_join_complete",
            generation.generation_id,
            generation.member_id,
            generation.protocol_name,
            assignment,
        ):
            with self._cond:
                self._retry_delay = min(self._retry_delay * 2, RETRY_MAX)
            return False
        with self._cond:
            self._completing = None
            self._prepared = False
            self._cond.notify_all()
        return True

    def _call(self, name: str, *args: Any) -> bool:
        """Run the handler's callback ``name``; False (logged) if it raised."""
        callback: Callable[..., object] = getattr(self._handler, name)
        try:
            callback(*args)
        except Exception:
            log.exception("%s of group %r raised", name, self.group)
            return False
        return True


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
