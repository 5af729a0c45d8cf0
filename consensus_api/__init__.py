"""consensus-api: one API for coordination over ZooKeeper, etcd, Kafka and SQL.

import consensus_api as ca

with ca.connect("etcd://127.0.0.1:2379/myapp", session_timeout=10) as session:
    session.storage.put("config/mode", b"fast")
"""

from consensus_api._version import __version__ as __version__
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
