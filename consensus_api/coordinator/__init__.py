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

Each public name is loaded on first use (PEP 562): a session that never coordinates, and a
backend that imports only :mod:`.describe` or :mod:`.engine`, does not load the engine (about
2 MiB of a session at rest, docs/performance.md).
"""

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from consensus_api.coordinator import describe as describe
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

#: Each public name and the module of this package that defines it.
_HOMES = {
    "NO_GENERATION": "handler",
    "Coordinator": "core",
    "CoordinatorHandler": "handler",
    "Generation": "handler",
    "GroupDescription": "description",
    "IncrementalCoordinator": "incremental",
    "MemberDescription": "description",
    "ResourceHandler": "resources",
    "ResourceListener": "handler",
}

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


def __getattr__(name: str) -> object:
    """The public ``name``, or the submodule ``describe``, imported on first use and kept here."""
    if name == "describe":
        return importlib.import_module(f"{__name__}.describe")
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value: object = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})
