"""Incremental rebalancing without a group-wide barrier (KIP-848), on every backend.

Members register their subscription (the resources they can take, stored once
per distinct set under ``subscriptions/<digest>``; the membership data holds
the digest). The member leading the group's election (a few members with the
smallest ids stand) runs the :class:`Steward`, the group coordinator. Each
member follows its own entry in the group state: it stops what it must revoke
(``on_revoked``) and acknowledges, then starts what it was given
(``on_assigned``). Nobody waits for the whole group, and:

* a resource is never owned by two members at once: it is given only once
  its previous owner acknowledged stopping it, left the group, or was fenced
  for not revoking within ``rebalance_timeout``;
* a member whose assignment does not change sees no callback;
* callbacks run on the coordinator's thread, ``consensus-coordinator-<group>``,
  one at a time; never on a client I/O thread or the session's dispatcher.

On session loss the member stops everything at once (``on_revoked``); it gets
its resources back through the steward like any joiner.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING

from consensus_api.assignors import Assignor, get_assignor
from consensus_api.coordinator.core import DEFAULT_REBALANCE_TIMEOUT, _positive
from consensus_api.coordinator.handler import ResourceListener
from consensus_api.coordinator.loop import Mirror, StepThread, register, stand
from consensus_api.coordinator.reconcile import FENCED, STABLE, Ack, GroupState, MemberState
from consensus_api.coordinator.records import group_segment
from consensus_api.coordinator.steward import Steward, publish_subscription
from consensus_api.errors import (
    ConfigurationError,
    ConsensusError,
    InvalidTypeError,
    KeyExistsError,
    NotAMemberError,
    OperationTimeoutError,
    SessionLostError,
)
from consensus_api.keys import check_key, check_segment
from consensus_api.model import LeaderChanged, Leadership, SessionState, ValueChanged

if TYPE_CHECKING:
    from consensus_api.session import Session

log = logging.getLogger("consensus_api.coordinator")

IDLE = 1.0
RETRY = 0.5


@dataclass(frozen=True, slots=True)
class IncrementalLayout:
    """Names of one incremental group: membership, election, state blob and acknowledgements."""

    group: str

    @property
    def root(self) -> str:
        return f"_incremental/{group_segment(self.group)}"

    @property
    def state(self) -> str:
        return f"{self.root}/state"

    def ack(self, member: str) -> str:
        return f"{self.root}/owned/{member}"

    def subscription(self, digest: str) -> str:
        return f"{self.root}/subscriptions/{digest}"


class IncrementalCoordinator:
    """A member of an incremental group; see ``session.incremental_coordinator``."""

    def __init__(
        self,
        session: Session,
        group: str,
        resources: Iterable[str],
        listener: ResourceListener,
        *,
        assignor: str | Assignor = "sticky",
        rebalance_timeout: float | None = None,
    ) -> None:
        self.group = check_key(group, "group name")
        if isinstance(resources, str):
            raise InvalidTypeError("resources must be an iterable of names, not one str")
        self.resources = frozenset(check_segment(r, "resource name") for r in resources)
        for name in ("on_assigned", "on_revoked"):
            if not callable(getattr(listener, name, None)):
                raise InvalidTypeError(f"the listener lacks {name} (see ResourceListener)")
        try:
            chosen = get_assignor(assignor)
        except ValueError as exc:
            raise ConfigurationError(str(exc)) from None
        self.rebalance_timeout = _positive(rebalance_timeout, DEFAULT_REBALANCE_TIMEOUT)
        self._session = session
        self._listener = listener
        self._layout = layout = IncrementalLayout(self.group)
        self._id = f"m-{uuid.uuid4().hex}"
        self._cond = threading.Condition()
        self._owned: frozenset[str] = frozenset()
        self._entry: MemberState | None = None
        self._reconciled = False
        self._acked: Ack | None = None
        self._registered = False
        self._leaderless = True
        self._states: list[SessionState] = []
        self._thread = StepThread(f"consensus-coordinator-{group}", self._step, self._finish)
        self._state: Mirror[ValueChanged] = Mirror(
            lambda cb: session.listeners.add_value_listener(layout.state, cb),
            lambda cb: session.listeners.remove_value_listener(layout.state, cb),
            self._thread.wake,
        )
        self._steward = Steward(session, layout, chosen, self.rebalance_timeout)
        self._membership = session.group(layout.root)
        self._election = session.election(layout.root)
        session.add_state_listener(self._on_session)

    # The public interface

    def ensure_active_group(self, timeout: float | None = None) -> int:
        """Join if not yet joined, then wait until this member is reconciled with the group's
        current target; returns its member epoch. ``OperationTimeoutError`` after ``timeout``
        (default: ``rebalance_timeout`` plus the session's ``request_timeout``)."""
        if self._thread.current():
            raise ConsensusError("ensure_active_group cannot be called from a coordinator callback")
        bound = (
            self.rebalance_timeout + self._session.settings.request_timeout if timeout is None else timeout
        )
        deadline = time.monotonic() + bound
        if self._thread.stopping:
            raise SessionLostError(f"the coordinator of group {self.group!r} is closed")
        self._thread.start()
        with self._cond:
            while True:
                if self._thread.stopping:
                    raise SessionLostError(f"the coordinator of group {self.group!r} is closed")
                if self._reconciled and self._entry is not None:
                    return self._entry.epoch
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise OperationTimeoutError(f"group {self.group!r} did not reconcile in {bound:.1f}s")
                self._cond.wait(min(remaining, 0.1))

    def member_id(self) -> str:
        """This member's id in the group."""
        return self._id

    def epoch(self) -> int | None:
        """This member's epoch (the group epoch it last reconciled to), or None before it has one."""
        with self._cond:
            return self._entry.epoch if self._entry is not None else None

    def assignment(self) -> frozenset[str]:
        """The resources this member owns now."""
        with self._cond:
            return self._owned

    def close(self, timeout: float | None = None) -> None:
        """Stop everything owned (``on_revoked``), then leave the group. Idempotent."""
        self._session.remove_state_listener(self._on_session)
        self._session._detach(self)
        bound = self._session.settings.request_timeout + 2 if timeout is None else timeout
        self._thread.stop(bound if self._thread.started else 0)
        with self._cond:
            self._cond.notify_all()

    def __enter__(self) -> IncrementalCoordinator:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<IncrementalCoordinator {self.group!r} {self._id} owns {len(self._owned)}>"

    # The coordinator thread

    def _step(self) -> float:
        with self._cond:
            states, self._states = self._states, []
        for change in states:
            if change is SessionState.LOST:
                self._set_owned(frozenset(), lost=True)
                self._acked = None
                self._registered = False
        if not self._registered:
            self._register()
            if not self._registered:
                return RETRY
        if self._leaderless:
            stand(self._session, self._layout.root, self._id)
        state = _decoded(self._state.event)
        entry = state.members.get(self._id) if state is not None else None
        if entry is None:
            self._set_owned(frozenset(), lost=True)  # not admitted yet, or dropped from the group
        elif entry.state == FENCED:
            self._set_owned(frozenset(), lost=True)
        else:
            self._set_owned(entry.assigned)
        if entry is not None:
            self._acknowledge(entry)
        with self._cond:
            self._entry = entry
            self._reconciled = (
                entry is not None
                and state is not None
                and entry.state == STABLE
                and entry.epoch == state.assignment_epoch
            )
            self._cond.notify_all()
        return IDLE

    def _register(self) -> None:
        self._state.start()
        self._election.add_listener(self._on_leader)
        digest = publish_subscription(self._session, self._layout, self.resources)
        self._registered = register(self._session, self._layout.root, self._id, digest)

    def _set_owned(self, wanted: frozenset[str], *, lost: bool = False) -> None:
        """Stop what is owned but not wanted, then start what is wanted but not owned."""
        with self._cond:
            owned = self._owned
        revoked, added = owned - wanted, wanted - owned
        if revoked:
            self._call("on_revoked", revoked)
            with self._cond:
                self._owned = owned = owned - revoked
        if added and not lost:
            self._call("on_assigned", added)
            with self._cond:
                self._owned = owned | added

    def _acknowledge(self, entry: MemberState) -> None:
        with self._cond:
            owned = self._owned
        last = self._acked
        if last is not None and last.seq >= entry.seq:
            return
        if last is not None and last.owned == owned and not entry.revoking and entry.state != FENCED:
            return  # nothing the steward waits for
        ack = Ack(entry.seq, owned)
        key = self._layout.ack(self._id)
        try:
            self._session.storage.put(key, ack.encode())
        except KeyExistsError:
            self._session.storage.update(key, ack.encode())
        self._acked = ack

    def _finish(self) -> None:
        self._set_owned(frozenset(), lost=True)
        self._steward.stop()
        self._state.stop()
        self._election.remove_listener(self._on_leader)
        leaves: list[Callable[[str], None]] = [self._election.resign, self._membership.leave]
        for leave in leaves:
            try:
                leave(self._id)
            except NotAMemberError:
                pass
            except ConsensusError as exc:
                log.info("leaving incremental group %r failed (%s)", self.group, exc)

    def _on_leader(self, event: LeaderChanged) -> None:
        self._leaderless = event.leader_id is None
        if event.leader_id == self._id and event.term is not None:
            self._steward.lead(Leadership(event.service, self._id, event.term))
        else:
            self._steward.lead(None)
        if self._leaderless:
            self._thread.wake()  # stand as a candidate if among the first

    def _on_session(self, state: SessionState) -> None:
        with self._cond:
            self._states.append(state)
        self._thread.wake()

    def _call(self, name: str, resources: frozenset[str]) -> None:
        try:
            getattr(self._listener, name)(resources)
        except Exception:
            log.exception("%s of incremental group %r raised; going on", name, self.group)


_cache_lock = threading.Lock()
_cache: dict[tuple[str, bytes], GroupState | None] = {}


def _decoded(event: ValueChanged | None) -> GroupState | None:
    """The group state in ``event``, decoded once for all the members of this process."""
    if event is None or event.value is None:
        return None
    key = (event.key, event.value)
    with _cache_lock:
        if key in _cache:
            return _cache[key]
    state = GroupState.decode(event.value)
    with _cache_lock:
        if len(_cache) >= 64:
            _cache.clear()
        _cache[key] = state
    return state
