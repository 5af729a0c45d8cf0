"""Sessions: one client's connection and liveness.

Contract: sections 2 and 3 of <https://consensus-api.github.io/consensus-api/spec/>
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from consensus_api import config, observability, registry
from consensus_api import coordinator as coordinator_api
from consensus_api._joined import Item, Joined
from consensus_api.backend import AsyncStorage, Backend, Reader, Target, TargetKind
from consensus_api.bridge_connect import session_backend
from consensus_api.closing import Closing
from consensus_api.dispatch import Dispatcher
from consensus_api.election import LeaderElection
from consensus_api.errors import NotAMemberError, SessionLostError
from consensus_api.keys import check_key
from consensus_api.listeners import RETRY_DELAY, ListenerHub, ListenerRegistry
from consensus_api.lock import Lock
from consensus_api.membership import GroupMembership
from consensus_api.model import (
    Event,
    KeySetChanged,
    LeaderChanged,
    MembershipChanged,
    SessionState,
    ValueChanged,
    frozen_members,
)
from consensus_api.storage import Storage

if TYPE_CHECKING:
    from consensus_api.assignors import Assignor

log = logging.getLogger("consensus_api")

StateListener = Callable[[SessionState], None]
C = TypeVar("C", "coordinator_api.Coordinator", "coordinator_api.IncrementalCoordinator")


def connect(url: str | None = None, **options: Any) -> Session:
    """Open a session on the backend ``url`` names.

    Without ``url``: ``$CONSENSUS_URL``, then ``consensus.toml`` (or the file
    ``$CONSENSUS_CONFIG`` names), then ``sqlite:///consensus.db``. Options come
    from that file, then the URL's query, then ``options``; unknown options and
    malformed URLs raise ``ConfigurationError`` before any I/O; ``migrate_to``: bridged (spec §14)."""
    raw_url, file_options = config.resolve(url)
    parsed, query = config.parse_url(raw_url)
    backend_class = registry.load_backend(parsed.scheme)
    merged = {**file_options, **query, **options}
    backend = session_backend(backend_class, parsed, merged, from_environment=url is None)
    settings = config.build_options(merged, backend_class.options, parsed.scheme, parsed)
    return Session(backend, parsed, settings)


class _Events:
    """What the backend calls; forwards to the session without blocking."""

    def __init__(self, session: Session) -> None:
        self._session = session

    def state_changed(self, state: SessionState) -> None:
        self._session._on_backend_state(state)

    def changed(self, target: Target) -> None:
        self._session._hub.changed(target)


class _Port:
    """The session as its storage, groups, elections and coordinators see it (a ``SessionPort``)."""

    def __init__(self, session: Session) -> None:
        self._session = session
        # What the session already does as the port describes it, handed on as is.
        self.backend_for_call = session._backend_for_call
        self.add_state_listener = session.add_state_listener
        self.remove_state_listener = session.remove_state_listener
        self.add_listener = session._hub.add
        self.remove_listener = session._hub.remove
        self.settings: config.Options = session.settings

    def async_storage(self) -> AsyncStorage | None:
        face, telemetry = self._session._backend.async_storage(), self._session._telemetry
        return face if face is None or telemetry is None else telemetry.measured_async(face)

    @property
    def state(self) -> SessionState:
        return self._session.state

    def join(self, group: str, member_id: str, data: bytes, *, rejoin: bool = True) -> None:
        session = self._session
        losses = session._joined.losses
        self.backend_for_call().join(group, member_id, data)
        session._record(("member", group, member_id), data, losses, rejoin)

    def leave(self, group: str, member_id: str) -> None:
        backend = self.backend_for_call()
        if not self.holds_member(group, member_id):
            raise NotAMemberError(f"this session has no member {member_id!r} in group {group!r}")
        try:
            backend.leave(group, member_id)
        finally:
            self._session._joined.forget(("member", group, member_id))

    def nominate(self, service: str, candidate_id: str, *, rejoin: bool = True) -> bool:
        session = self._session
        losses = session._joined.losses
        leads = self.backend_for_call().nominate(service, candidate_id)
        session._record(("candidacy", service, candidate_id), b"", losses, rejoin)
        return leads

    def resign(self, service: str, candidate_id: str) -> None:
        backend = self.backend_for_call()
        if not self.holds_candidacy(service, candidate_id):
            raise NotAMemberError(f"this session has no candidate {candidate_id!r} for {service!r}")
        try:
            backend.resign(service, candidate_id)
        finally:
            self._session._joined.forget(("candidacy", service, candidate_id))

    def holds_member(self, group: str, member_id: str) -> bool:
        return self._session._joined.holds(("member", group, member_id))

    def holds_candidacy(self, service: str, candidate_id: str) -> bool:
        return self._session._joined.holds(("candidacy", service, candidate_id))

    def detach(self, coordinator: object) -> None:
        session = self._session
        with session._lock:
            session._coordinators = [c for c in session._coordinators if c is not coordinator]


class Session(Closing):
    """A connection whose lifetime bounds every member, candidacy and leadership.

    SUSPENDED means connection trouble while ephemeral state may still exist;
    LOST means it is (or may be) gone: every leader is told, every listener is
    re-synced and, with ``auto_rejoin``, what the application had joined is
    joined again once the backend is CONNECTED. Callbacks run on the session's
    dispatcher thread.
    """

    def __init__(
        self, backend_factory: Callable[..., Backend], url: config.BackendURL, settings: config.Options
    ) -> None:
        self.url = url
        self.settings = settings
        self._lock = threading.RLock()
        self._state = SessionState.CONNECTED
        self._state_listeners: list[StateListener] = []
        #: The members and candidacies to release at close and join again after a loss.
        self._joined = Joined(self._lock)
        self._coordinators: list[coordinator_api.Coordinator | coordinator_api.IncrementalCoordinator] = []
        self._dispatcher = Dispatcher(url.scheme)
        try:
            self._backend = backend_factory(url, settings, _Events(self))
            self._telemetry = observability.for_session(self._backend.name)
            #: What the session's calls use once a meter or tracer provider is installed (otel extra):
            #: the backend, timed and traced; until then the backend itself (``_backend_for_call``).
            self._measured = self._telemetry.measured(self._backend) if self._telemetry else self._backend
            self._hub = ListenerHub(
                self._dispatcher,
                self._read,
                self._backend.watch,
                self._backend.unwatch,
                lambda: self._state is SessionState.CONNECTED,
                on_read=self._telemetry.event_read if self._telemetry else None,
            )
            self._backend.open()
        except BaseException:
            self._dispatcher.stop(1.0)  # a failed connect leaves no thread behind
            raise
        self._port = _Port(self)
        self.storage = Storage(self._port)
        self.listeners = ListenerRegistry(self._hub)

    @property
    def backend(self) -> str:
        """The backend's name: sqlite, postgresql, zookeeper, etcd or kafka."""
        return self._backend.name

    @property
    def state(self) -> SessionState:
        """The session's current state."""
        return self._state

    def server_version(self) -> str | None:
        """The version the server reports, or None where the backend cannot tell (Kafka)."""
        return self._backend_for_call().server_version()

    def group(self, name: str) -> GroupMembership:
        """The group ``name`` (a key-like name)."""
        return GroupMembership(self._port, check_key(name, "group name"))

    def election(self, service: str) -> LeaderElection:
        """The election for ``service`` (a key-like name)."""
        return LeaderElection(self._port, check_key(service, "service name"))

    def lock(self, name: str, *, shared: bool = False) -> Lock:
        """The fenced lock ``name`` (a key-like name); ``shared``: a reader lock (``consensus_api.lock``)."""
        return Lock(self._port, name, shared=shared)

    def coordinator(
        self,
        group: str,
        protocol_type: str,
        handler: coordinator_api.CoordinatorHandler,
        *,
        rebalance_timeout: float | None = None,
        group_instance_id: str | None = None,
    ) -> coordinator_api.Coordinator:
        """A member of ``group`` in Kafka's rebalance protocol (<https://consensus-api.github.io/consensus-api/spec/#8-coordinator-kip-795--the-kafka-rebalance-protocol-as-an-api>);
        joins on ``ensure_active_group``; static (KIP-345) with a ``group_instance_id``; closed with it."""
        if self._telemetry is not None:
            handler = self._telemetry.observed_handler(handler, group)
        coordinator = coordinator_api.Coordinator(
            self._port,
            group,
            protocol_type,
            handler,
            rebalance_timeout=rebalance_timeout,
            group_instance_id=group_instance_id,
        )
        return self._attach(coordinator)

    def incremental_coordinator(
        self,
        group: str,
        resources: Iterable[str],
        listener: coordinator_api.ResourceListener,
        *,
        assignor: str | Assignor = "sticky",
        rebalance_timeout: float | None = None,
        group_instance_id: str | None = None,
    ) -> coordinator_api.IncrementalCoordinator:
        """A member of ``group`` sharing ``resources`` by incremental (KIP-848) reconciliation; joins on
        ``ensure_active_group``; static (KIP-345) with a ``group_instance_id``. Closed with the session."""
        coordinator = coordinator_api.IncrementalCoordinator(
            self._port,
            group,
            resources,
            listener,
            assignor=assignor,
            rebalance_timeout=rebalance_timeout,
            group_instance_id=group_instance_id,
        )
        return self._attach(coordinator)

    def describe_group(self, group: str) -> coordinator_api.GroupDescription:
        """A snapshot of the coordinated group ``group`` (<https://consensus-api.github.io/consensus-api/spec/#8-coordinator-kip-795--the-kafka-rebalance-protocol-as-an-api>):
        mode, state, generation or group epoch, protocol, and each member's instance id, epoch and
        assignment."""
        return coordinator_api.describe.describe_group(self._port, group)

    def add_state_listener(self, callback: StateListener) -> None:
        """Call ``callback(state)`` on the dispatcher thread at every state change."""
        if not callable(callback):
            raise TypeError(f"callback must be callable, not {type(callback).__name__}")
        with self._lock:
            if callback not in self._state_listeners:
                self._state_listeners.append(callback)

    def remove_state_listener(self, callback: StateListener) -> None:
        """Stop calling ``callback``; unknown callbacks are ignored."""
        with self._lock:
            if callback in self._state_listeners:
                self._state_listeners.remove(callback)

    def close(self) -> None:
        """Close every coordinator, release every member and candidacy and disconnect. Idempotent."""
        with self._lock:
            coordinators, self._coordinators = self._coordinators, []
        for coordinator in coordinators:
            coordinator.close()
        with self._lock:
            if self._state is SessionState.CLOSED:
                return
            self._state = SessionState.CLOSED
            self._joined.clear()
        try:
            self._backend.close()
        finally:
            self._dispatcher.submit(lambda: self._notify_state(SessionState.CLOSED))
            self._dispatcher.stop(self.settings.request_timeout)

    def __repr__(self) -> str:
        return f"<Session {self.url.redacted()} {self._state.name}>"

    # Used by this session's views (``_Port``).

    def _attach(self, coordinator: C) -> C:
        with self._lock:
            self._coordinators.append(coordinator)
        return coordinator

    def _backend_for_call(self) -> Backend:
        if self._state is SessionState.CLOSED:
            raise SessionLostError("the session is closed; open a new one with consensus_api.connect()")
        telemetry = self._telemetry
        if telemetry is not None and telemetry.recording():
            return self._measured
        return self._backend

    def _record(self, item: Item, data: bytes, losses: int, rejoin: bool) -> None:
        """Track a member or candidacy joined while the session had ``losses`` losses; if a loss
        overtook the call, join it again like everything the loss voided (``Joined.record``)."""
        if self._joined.record(item, data, losses, rejoin=rejoin, auto_rejoin=self.settings.auto_rejoin):
            self._dispatcher.submit(self._rejoin)

    # Reports from the backend and their handling on the dispatcher thread.

    def _read(self, target: Target, strict: bool) -> Event:
        """The target's state; ``strict``: linearizable, else a re-read after a reported change."""
        backend = self._backend_for_call()
        reader: Reader = backend if strict else backend.change_reader()
        if target.kind is TargetKind.VALUE:
            current = reader.fetch(target.name)
            if current is None:
                return ValueChanged(target.name, None, None)
            return ValueChanged(target.name, current.value, current.version)
        if target.kind is TargetKind.KEYSET:
            return KeySetChanged(target.name, reader.keys(target.name))
        if target.kind is TargetKind.GROUP:
            return MembershipChanged(target.name, frozen_members(reader.membership(target.name)))
        leadership = reader.leadership(target.name)
        if leadership is None:
            return LeaderChanged(target.name, None, None)
        return LeaderChanged(target.name, leadership.leader_id, leadership.term)

    def _on_backend_state(self, state: SessionState) -> None:
        with self._lock:
            previous = self._state
            if previous is SessionState.CLOSED or state is previous:
                return
            self._state = state
            if state is SessionState.LOST:
                self._joined.lost()
        if self._telemetry is not None:
            self._telemetry.state_changed(state)
        self._dispatcher.submit_urgent(lambda: self._transition(previous, state))

    def _transition(self, previous: SessionState, state: SessionState) -> None:
        if state is SessionState.LOST:
            self._announce_lost_leadership()
            if not self.settings.auto_rejoin:
                self._joined.clear()
        self._notify_state(state)
        if state is SessionState.CONNECTED:
            if previous is SessionState.LOST and self.settings.auto_rejoin:
                self._rejoin()
            self._hub.resync()

    def _announce_lost_leadership(self) -> None:
        ours = self._joined.candidacies()
        for service in {service for service, _ in ours}:
            ours_here = {candidate for s, candidate in ours if s == service}
            self._hub.announce_leader_lost(service, ours_here)

    def _rejoin(self, due: tuple[dict[Item, bytes], list[Item]] | None = None) -> None:
        """Join again what the application had joined (``due``: all of it); retry only what failed
        for a passing reason."""
        if self._state is not SessionState.CONNECTED:
            return
        members, candidacies = self._joined.due() if due is None else due
        backend = self._backend
        redo = self._joined.redo
        failed_members = {
            item: data for item, data in members.items() if not redo(item, partial(_join, backend, data))
        }
        failed_candidacies = [item for item in candidacies if not self._joined.redo(item, backend.nominate)]
        if failed_members or failed_candidacies:
            self._dispatcher.submit_later(
                RETRY_DELAY, partial(self._rejoin, (failed_members, failed_candidacies))
            )

    def _notify_state(self, state: SessionState) -> None:
        with self._lock:
            listeners = list(self._state_listeners)
        for listener in listeners:
            try:
                listener(state)
            except Exception:
                log.exception("state listener %r raised; delivery continues", listener)


def _join(backend: Backend, data: bytes, group: str, member_id: str) -> None:
    backend.join(group, member_id, data)
