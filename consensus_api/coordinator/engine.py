"""The engine interface: what runs the rebalance protocol under a :class:`Coordinator`.

A backend may supply its own engine (``Backend.coordinator_engine``; Kafka runs
the real JoinGroup/SyncGroup protocol); otherwise the generic engine builds the
protocol on the session's storage, membership and election. The
:class:`Coordinator` owns the handler and calls the engine only on its own
thread; the engine reports back through :class:`EngineHost`, also on that
thread, except ``wake`` (any thread).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping

from consensus_api.coordinator.handler import Generation
from consensus_api.errors import ConsensusError
from consensus_api.model import SessionState

Protocols = list[tuple[str, bytes]]


class EngineHost(ABC):
    """The coordinator as its engine sees it."""

    @property
    @abstractmethod
    def group_instance_id(self) -> str | None:
        """The member's static identity (KIP-345 ``group.instance.id``), or None (dynamic). An
        engine that supports static membership keeps a restarted member's assignment for the
        session timeout and fences an older live member of the same instance."""

    @abstractmethod
    def protocols(self) -> Protocols:
        """The handler's current protocols and metadata (checked)."""

    @abstractmethod
    def rejoin(self) -> Protocols:
        """A join starts: ``on_join_prepare`` (once per join), then the handler's metadata."""

    @abstractmethod
    def assign(self, leader_id: str, protocol: str, members: Mapping[str, bytes]) -> dict[str, bytes] | None:
        """``perform_assignment``, checked; None if the handler failed (retry later)."""

    @abstractmethod
    def complete(self, generation: Generation, assignment: bytes) -> None:
        """``on_join_complete``: the member holds ``generation`` now."""

    @abstractmethod
    def lost(self) -> None:
        """The membership is gone: the handler drops what it holds (``on_join_prepare(-1, "")``)."""

    @abstractmethod
    def fail(self, error: ConsensusError) -> None:
        """A fatal error: ``ensure_active_group`` raises it and the coordinator stops."""

    @abstractmethod
    def wake(self) -> None:
        """Run the engine's ``step`` soon (any thread, never blocks)."""


class CoordinatorEngine(ABC):
    """One member's side of the rebalance protocol; every method runs on the coordinator thread,
    except ``member_id``, ``rebalancing`` and ``request_rejoin`` (any thread, never block)."""

    @abstractmethod
    def start(self) -> None:
        """Register with the group; ``InconsistentGroupProtocolError`` if it shares no protocol."""

    @abstractmethod
    def step(self) -> float:
        """Make progress; returns the seconds after which to step again at the latest."""

    @abstractmethod
    def session_state(self, state: SessionState) -> None:
        """The session changed state (LOST: the membership is void)."""

    @abstractmethod
    def close(self, deadline: float) -> None:
        """Leave the group; best effort until ``deadline`` (monotonic)."""

    @abstractmethod
    def member_id(self) -> str:
        """This member's id in the group ('' before it has one)."""

    @abstractmethod
    def rebalancing(self) -> bool:
        """True while a rebalance is known to be pending or under way."""

    @abstractmethod
    def request_rejoin(self) -> None:
        """Ask for a new rebalance (e.g. the follow-up round of the cooperative protocol); asked
        while a join is under way, a rebalance follows that join."""
