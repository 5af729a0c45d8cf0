"""The Coordinator: Kafka's rebalance protocol, and incremental rebalancing.

Contract: <https://consensus-api.github.io/consensus-api/spec/#8-coordinator-kip-795--the-kafka-rebalance-protocol-as-an-api>

* :class:`Coordinator` (``session.coordinator``): register with protocol
  metadata, one member is the leader and assigns, every member receives its
  assignment; eager, generation by generation. On Kafka it is the real
  JoinGroup/SyncGroup protocol, elsewhere the generic engine
  (:mod:`.generic`) on storage, membership and election.
* :class:`ResourceHandler`: a ready-made handler spreading named resources
  with the assignors of :mod:`consensus_api.assignors`, eager or cooperative.
* :class:`IncrementalCoordinator` (``session.incremental_coordinator``):
  KIP-848 reconciliation, no group-wide barrier, on every backend.

This package holds the public part: the two coordinators, the handler
interfaces, :class:`ResourceHandler`, and the engine interface a backend may
implement (:mod:`.engine`). :mod:`.generic` is the machinery that runs a group
on the primitives; nothing outside this package imports it.
"""

from consensus_api.coordinator.core import Coordinator
from consensus_api.coordinator.description import GroupDescription, MemberDescription
from consensus_api.coordinator.handler import (
    NO_GENERATION,
    CoordinatorHandler,
    Generation,
    ResourceListener,
)
from consensus_api.coordinator.incremental import IncrementalCoordinator
from consensus_api.coordinator.resources import ResourceHandler

__all__ = [
    "NO_GENERATION",
    "Coordinator",
    "CoordinatorHandler",
    "Generation",
    "GroupDescription",
    "IncrementalCoordinator",
    "MemberDescription",
    "ResourceHandler",
    "ResourceListener",
]
