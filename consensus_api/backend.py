"""The backend interface: what a backend maps onto its store, and nothing else.

The core (``consensus_api.session``) owns validation, listener bookkeeping,
event ordering and delivery, re-joining after a session loss and the public
objects. A backend implements the primitive operations below and reports two
things through ``BackendEvents``: its session state, and *that* a watched
target may have changed. The core then re-reads the target on the session's
dispatcher thread, so events for one target are produced by one thread, in
order, from reads that never go back in time.

Obligations of every backend:

* Arguments arrive already checked (keys, names, values, versions).
* Every call returns or raises within ``options.request_timeout`` (plus a
  small margin); only ``ConsensusError`` subclasses escape.
* ``fetch`` is linearizable: it sees every write completed before it started.
* A version strictly increases for a key across its updates, also across
  delete and re-create. Terms strictly increase across leaders of a service.
* A fenced write checks, atomically with the write, that ``fence.term`` is
  the current term of ``fence.service``; otherwise it raises ``FencedError``.
* A write that raises ``SessionLostError`` was not applied (one whose effect
  is unknown raises ``OperationTimeoutError``); the core turns it into
  ``FencedError`` for a fenced write whose candidacy this session held.
* Members and candidates live exactly as long as the backend session. Before
  reporting ``SessionState.LOST`` the backend makes sure the old session's
  ephemeral state is gone or will be gone before any new session state is
  created; after ``LOST`` it re-establishes a session and reports
  ``CONNECTED``. The core re-joins what the application had joined.
* ``LOST`` comes before another session can act on this one's expiry, so
  what the application held is given up first. A session kept as a lease it
  renews presumes the lease lapsed at ``lapses_at`` and tries a renewal then
  (``retry_pause``), not only at its regular pace.
* After ``watch(target)`` every change of the target's state is followed by
  at least one ``events.changed(target)``; after a reconnect the core
  re-reads every watched target itself.
"""

from __future__ import annotations

import enum
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Protocol

from consensus_api.config import BackendURL, OptionParser, Options
from consensus_api.model import Leadership, SessionState, Versioned

if TYPE_CHECKING:
    from consensus_api.coordinator.description import GroupDescription
    from consensus_api.coordinator.engine import CoordinatorEngine, EngineHost


#: A renewed lease is presumed lapsed this share of the session timeout (at most
#: ``LAPSE_MARGIN_MAX`` seconds) before it can expire on the server.
LAPSE_MARGIN = 0.1
LAPSE_MARGIN_MAX = 0.2


def lapses_at(renewal_began: float, session_timeout: float) -> float:
    """When a session whose last successful renewal began at ``renewal_began`` (``time.monotonic()``)
    presumes its lease lapsed: a margin before the earliest moment the server can expire it, which
    counts from the renewal's arrival there, later than its start here."""
    return renewal_began + session_timeout - min(session_timeout * LAPSE_MARGIN, LAPSE_MARGIN_MAX)


def retry_pause(pause: float, lapse: float, shortest: float) -> float:
    """``pause`` until the next renewal attempt of a session in trouble, cut short so that an attempt
    comes as the lease lapses at ``lapse`` (``time.monotonic()``), but never shorter than ``shortest``."""
    return min(pause, max(shortest, lapse - time.monotonic()))


class TargetKind(enum.Enum):
    """What a listener watches."""

    VALUE = "value"
    KEYSET = "keyset"
    GROUP = "group"
    ELECTION = "election"


@dataclass(frozen=True, slots=True)
class Target:
    """A watched thing: a key's value, a namespace's keys, a group or an election."""

    kind: TargetKind
    name: str


class BackendEvents(Protocol):
    """How a backend reports to its session; both calls return at once."""

    def state_changed(self, state: SessionState) -> None:
        """The backend session is now ``state`` (never ``CLOSED``: the core sets that)."""

    def changed(self, target: Target) -> None:
        """``target`` may have changed; the core will re-read it."""


class Reader(Protocol):
    """The reads behind listener events; every ``Backend`` is one."""

    def fetch(self, key: str) -> Versioned | None: ...

    def keys(self, namespace: str) -> frozenset[str]: ...

    def membership(self, group: str) -> dict[str, bytes]: ...

    def leadership(self, service: str) -> Leadership | None: ...


class Writer(Protocol):
    """The writes of ``Backend`` (same arguments, results and errors), for ``nowait_writer``."""

    def put(self, key: str, value: bytes, fence: Leadership | None) -> int: ...

    def update(self, key: str, value: bytes, version: int | None, fence: Leadership | None) -> int: ...

    def delete(self, key: str, version: int | None, fence: Leadership | None) -> None: ...


class AsyncStorage(Protocol):
    """A backend's storage over its client library's own asyncio API, bound to the event loop it
    was made on (``Backend.async_storage``). Same arguments, results, errors and guarantees as the
    backend's blocking calls (arguments arrive checked, a fence as a ``Leadership``; only
    ``ConsensusError`` escapes; every call ends within ``request_timeout``; ``SessionLostError`` for
    a write not applied because the session is gone); a call cancelled by its caller has an unknown
    effect and leaves nothing behind for a later call (no unread reply on a shared connection).
    No worker thread and no cap of its own on calls in flight beyond its connections'.

    The core keeps the contract's rules on the way in and out, as for the blocking calls
    (``consensus_api.storage.NativeStorage``): the closed-session check, argument checks, a
    ``Lease`` as its fence, ``FencedError`` for a write that lost its candidacy with the session,
    metrics and traces. It never calls a face after ``aclose``."""

    async def fetch(self, key: str) -> Versioned | None: ...

    async def put(self, key: str, value: bytes, fence: Leadership | None) -> int: ...

    async def update(self, key: str, value: bytes, version: int | None, fence: Leadership | None) -> int: ...

    async def delete(self, key: str, version: int | None, fence: Leadership | None) -> None: ...

    async def keys(self, namespace: str) -> frozenset[str]: ...

    async def aclose(self) -> None:
        """Release what the face holds (connections, channels); idempotent."""


class WouldBlock(Exception):  # noqa: N818 - a signal between the SPI and the core, not an error
    """A ``nowait_reader()`` read or ``nowait_writer()`` write that would have to wait (for a lock,
    a connection, another process or the network) and did nothing; the caller makes the ordinary
    call instead. Applications see it only from ``Storage``'s ``*_nowait`` calls, which say so."""


class Backend(ABC):
    """One client session against one backend."""

    #: Backend-specific options (besides the common ones) and their parsers.
    options: ClassVar[Mapping[str, OptionParser]] = {}

    def __init__(self, url: BackendURL, options: Options, events: BackendEvents) -> None:
        self.url = url
        self.settings = options
        self.events = events

    @property
    @abstractmethod
    def name(self) -> str:
        """The backend's name: ``sqlite``, ``postgresql``, ``zookeeper``, ``etcd`` or ``kafka``."""

    @abstractmethod
    def open(self) -> None:
        """Connect and start the session; ``BackendUnavailableError`` after ``connect_timeout``."""

    @abstractmethod
    def close(self) -> None:
        """Release every member and candidacy at once and disconnect. Idempotent."""

    # Storage (<https://consensus-api.github.io/consensus-api/spec/#4-storage-kip-30-storage>)

    @abstractmethod
    def fetch(self, key: str) -> Versioned | None:
        """The key's value and version, or None."""

    @abstractmethod
    def put(self, key: str, value: bytes, fence: Leadership | None) -> int:
        """Create ``key``; ``KeyExistsError`` if it exists. Returns the new version."""

    @abstractmethod
    def update(self, key: str, value: bytes, version: int | None, fence: Leadership | None) -> int:
        """Replace the value; ``KeyNotFoundError``, ``VersionConflictError``."""

    @abstractmethod
    def delete(self, key: str, version: int | None, fence: Leadership | None) -> None:
        """Remove ``key``; ``KeyNotFoundError``, ``VersionConflictError``."""

    @abstractmethod
    def keys(self, namespace: str) -> frozenset[str]:
        """The existing keys exactly one level below ``namespace`` (``""`` is the root)."""

    @abstractmethod
    def walk(self, namespace: str) -> Iterator[tuple[str, Versioned]]:
        """Every live key at any depth below ``namespace`` (``""``: every key), with its value.

        Read in pages, each bounded by ``request_timeout``, so no response holds
        the whole tree. Not atomic: every pair yielded was the key's stored state
        at some moment between the call and the yield (a linearizable read); no
        key is yielded twice; a key that exists throughout is yielded; keys
        written during the walk may or may not appear. ``namespace`` itself is
        not yielded. Order is unspecified.
        """

    # Group membership (<https://consensus-api.github.io/consensus-api/spec/#6-groupmembership-kip-30-groupmembershipclient>)

    @abstractmethod
    def join(self, group: str, member_id: str, data: bytes) -> None:
        """Add an ephemeral member; ``MemberExistsError`` if a live one has that id."""

    @abstractmethod
    def leave(self, group: str, member_id: str) -> None:
        """Remove this session's member; ``NotAMemberError`` if it holds none by that id."""

    @abstractmethod
    def membership(self, group: str) -> dict[str, bytes]:
        """The live members of ``group`` and their data."""

    # Leader election (<https://consensus-api.github.io/consensus-api/spec/#7-leaderelection-kip-30-leaderelectionclient>)

    @abstractmethod
    def nominate(self, service: str, candidate_id: str) -> bool:
        """Queue an ephemeral candidate; True if it leads now.

        ``MemberExistsError`` if a live candidate already has that id.
        """

    @abstractmethod
    def resign(self, service: str, candidate_id: str) -> None:
        """Withdraw this session's candidate; ``NotAMemberError`` if it holds none."""

    @abstractmethod
    def leadership(self, service: str) -> Leadership | None:
        """The current leader and term, or None."""

    # Watches (<https://consensus-api.github.io/consensus-api/spec/#5-listenerregistry-kip-30-listenerregistry>)

    @abstractmethod
    def watch(self, target: Target) -> None:
        """Start reporting changes of ``target``; must not block on the network for long."""

    @abstractmethod
    def unwatch(self, target: Target) -> None:
        """Stop reporting changes of ``target``."""

    def change_reader(self) -> Reader:
        """What the core re-reads a target with after ``events.changed(target)``.

        Such a read need not be linearizable: it must see at least the change
        reported and never less than an earlier read of this session saw. The
        first read after a listener is added and the reads after a reconnect
        use the backend itself. Default: the backend itself.
        """
        return self

    def nowait_reader(self) -> Reader | None:
        """Reads that answer on the calling thread without ever waiting, for an event loop's thread.

        Each call of the reader returns what the backend's own call would
        (linearizable), or raises ``WouldBlock`` at once where it would have to
        wait for a lock, a connection, another process or the network; it then
        had no effect. Only local, fast stores can offer it (SQLite on an open
        WAL connection). Default: None (every read may wait).
        """
        return None

    def nowait_writer(self) -> Writer | None:
        """Writes that answer on the calling thread without ever waiting, for an event loop's thread.

        Each write does what the backend's own write would (same checks, fence,
        results and errors; ``OperationTimeoutError`` if its effect is unknown),
        or raises ``WouldBlock`` at once, having done nothing (not applied),
        where it would have to wait for a lock, a connection, another process or
        the network. Only local, fast stores can offer it (SQLite, when the write
        lock is free). Default: None (every write may wait).
        """
        return None

    def async_storage(self) -> AsyncStorage | None:
        """Storage through the client library's own asyncio API, for the running event loop (called
        on it, once per ``consensus_api.aio`` session, right after the session opened), or None
        (the default): the aio session then runs the blocking calls on its worker threads, and
        every other call (groups, elections, locks, listeners, ``walk``) always. No I/O until the
        first call; ``aclose`` comes after the session closed."""
        return None

    def server_version(self) -> str | None:
        """The server's software version (``"3.8.0"``), or None when the backend cannot tell.

        Called on an open backend; at most one request, bounded by
        ``request_timeout``; never raises for a version it cannot read.
        Default: None.
        """
        return None

    @classmethod
    def missing_storage(cls, url: BackendURL) -> str | None:
        """Where ``url`` names storage that opening would create (a database file not yet there), that
        place; None when opening creates nothing (the default: a server's storage). No I/O beyond a
        local file check; read-only commands refuse to create storage by it."""
        return None

    # Migration (<https://consensus-api.github.io/consensus-api/spec/#14-migration-between-backends>)

    @abstractmethod
    def term_ceiling(self) -> int:
        """A number at least as high as every term (so every lock token) this store has issued, for
        any service, to any session, so far: native terms, without the core's term floor. At most a
        couple of requests, bounded by ``request_timeout``; never lower than an earlier answer."""

    @abstractmethod
    def seal(self) -> None:
        """Seal the store this URL addresses: once ``seal`` returns, every ``put``, ``update`` and
        ``delete`` of any session on it, this one included, raises ``SealedError`` and is not
        applied, checked atomically with the write (a write racing the seal is either applied
        before it or refused). Reads, members and candidates are not affected. Idempotent."""

    @abstractmethod
    def unseal(self) -> None:
        """Undo ``seal`` (a migration's roll-back): writes are accepted again. Idempotent."""

    @abstractmethod
    def sealed(self) -> bool:
        """Whether the store is sealed now (a linearizable read)."""

    @abstractmethod
    def session_identity(self) -> str:
        """What names this backend session on the server, as ``live_sessions`` lists it (a ZooKeeper
        session id, an etcd lease, a SQL lease row); stable until the session is LOST."""

    @abstractmethod
    def live_sessions(self) -> frozenset[str] | None:
        """The ``session_identity`` of every live session on this store (every client of it, not only
        this process's), or None where the store cannot list them; a migration's cut-over refuses
        while one of them is not bridged."""

    # Fault tools (the test kit only)

    def fault_identity(self) -> Mapping[str, object]:
        """What names this client's current session *on the server*, for fault-injection tests.

        The test kit's server-side expiry (a test profile's ``expire_session``) reads it to end the
        session from the server side, as a real expiry would; nothing else
        does. JSON-able values whose meaning is per backend (a ZooKeeper
        session id and password, an etcd lease id, a SQL lease row, Kafka
        group member ids); empty for a backend without server-side sessions.
        Not part of the public API.
        """
        return {}

    # Coordinator (<https://consensus-api.github.io/consensus-api/spec/#8-coordinator-kip-795--the-kafka-rebalance-protocol-as-an-api>)

    def coordinator_engine(
        self, group: str, protocol_type: str, host: EngineHost, rebalance_timeout: float
    ) -> CoordinatorEngine | None:
        """A backend-native engine for one Coordinator member, or None (the default) for the
        generic engine built on the operations above. Must not block on the network."""
        return None

    def describe_coordinator_group(self, group: str) -> GroupDescription | None:
        """The backend-native engine's view of ``group`` (``consensus group describe``), or None
        (the default: the generic engine's records are read)."""
        return None
