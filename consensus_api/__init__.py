"""consensus-api: one API for coordination over ZooKeeper, etcd, Kafka and SQL.

import consensus_api as ca

with ca.connect("etcd://127.0.0.1:2379/myapp", session_timeout=10) as session:
    session.storage.put("config/mode", b"fast")

The coordinator's names and the assignors are loaded on first use (PEP 562): an application
that never coordinates does not load them (docs/performance.md, "A session at rest").
"""

import importlib
from typing import TYPE_CHECKING

from consensus_api._version import __version__ as __version__
from consensus_api.election import LeaderElection
from consensus_api.errors import (
    BackendUnavailableError,
    ConfigurationError,
    ConsensusError,
    FencedError,
    InconsistentGroupProtocolError,
    InvalidKeyError,
    InvalidTypeError,
    KeyExistsError,
    KeyNotFoundError,
    MemberExistsError,
    NotAMemberError,
    OperationTimeoutError,
    PermissionDeniedError,
    SealedError,
    SessionLostError,
    ValueTooLargeError,
    VersionConflictError,
)
from consensus_api.listeners import ListenerRegistry
from consensus_api.lock import Lease, Lock, LockLost
from consensus_api.membership import GroupMembership
from consensus_api.model import (
    Event,
    KeySetChanged,
    LeaderChanged,
    Leadership,
    MembershipChanged,
    SessionState,
    ValueChanged,
    Versioned,
)
from consensus_api.session import Session, connect
from consensus_api.storage import Storage

if TYPE_CHECKING:
    from consensus_api.assignors import Assignor, Subscription
    from consensus_api.coordinator import (
        NO_GENERATION,
        Coordinator,
        CoordinatorHandler,
        Generation,
        GroupDescription,
        IncrementalCoordinator,
        MemberDescription,
        ResourceHandler,
        ResourceListener,
    )

#: The names loaded on first use, each with the module that defines it.
_LAZY = {
    "Assignor": "consensus_api.assignors",
    "Subscription": "consensus_api.assignors",
    **dict.fromkeys(
        (
            "NO_GENERATION",
            "Coordinator",
            "CoordinatorHandler",
            "Generation",
            "GroupDescription",
            "IncrementalCoordinator",
            "MemberDescription",
            "ResourceHandler",
            "ResourceListener",
        ),
        "consensus_api.coordinator",
    ),
}

__all__ = [
    "NO_GENERATION",
    "Assignor",
    "BackendUnavailableError",
    "ConfigurationError",
    "ConsensusError",
    "Coordinator",
    "CoordinatorHandler",
    "Event",
    "FencedError",
    "Generation",
    "GroupDescription",
    "GroupMembership",
    "InconsistentGroupProtocolError",
    "IncrementalCoordinator",
    "InvalidKeyError",
    "InvalidTypeError",
    "KeyExistsError",
    "KeyNotFoundError",
    "KeySetChanged",
    "LeaderChanged",
    "LeaderElection",
    "Leadership",
    "Lease",
    "ListenerRegistry",
    "Lock",
    "LockLost",
    "MemberDescription",
    "MemberExistsError",
    "MembershipChanged",
    "NotAMemberError",
    "OperationTimeoutError",
    "PermissionDeniedError",
    "ResourceHandler",
    "ResourceListener",
    "SealedError",
    "Session",
    "SessionLostError",
    "SessionState",
    "Storage",
    "Subscription",
    "ValueChanged",
    "ValueTooLargeError",
    "VersionConflictError",
    "Versioned",
    "connect",
]


def __getattr__(name: str) -> object:
    """The public ``name`` of :data:`_LAZY`, imported on first use and kept here."""
    home = _LAZY.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value: object = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
