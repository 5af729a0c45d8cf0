"""The floor: an offset added to every term and version a store reports, so that tokens and versions
keep rising across a migration.

A store's floor ``F`` is the decimal value of the reserved key ``FLOOR_KEY`` in its own key space
(under the URL's prefix; absent = 0). ``FloorBackend`` wraps a backend and translates both ways:

* every term it reports (``leadership``, hence ``LeaderChanged``, lock tokens and ``describe``) is
  the native term + ``F``; ``term_ceiling`` is the native ceiling + ``F``;
* every fence passed down carries ``term - F``; a fence whose term is at most ``F`` was issued
  before the floor was raised (or on another store) and is refused with ``FencedError``;
* every version it reports (``fetch``, ``walk``, the writes' results) is the native version + ``F``;
  an expected version passed down is ``version - F``, and one at most ``F`` (read before the floor
  was raised, or on the old store of a migration) never matches: ``VersionConflictError`` (or
  ``KeyNotFoundError`` for an absent key), so a compare-and-set decided on the old store cannot
  overwrite what the new one holds.

``F`` is read at ``open`` and the key is watched: when it changes, every watched election is
reported changed, so listeners see the raised terms; a fenced write or a leadership read after a
reported change reads ``F`` afresh first. ``F`` only rises (``raise_floor``), and a term it would
push past ``2**63 - 1`` is refused with ``ConsensusError`` before anything is written.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

from consensus_api.backend import (
    AsyncStorage,
    Backend,
    BackendEvents,
    Reader,
    Target,
    TargetKind,
    Writer,
)
from consensus_api.config import BackendURL, Options
from consensus_api.errors import ConsensusError, FencedError, KeyExistsError, VersionConflictError
from consensus_api.floor_views import (
    FloorAsyncStorage,
    FloorEvents,
    FloorNowaitReader,
    FloorReader,
    FloorWriter,
    version_refusal,
)
from consensus_api.keys import MAX_VERSION
from consensus_api.model import Leadership, Versioned

#: The floor's key, in every store's own key space.
FLOOR_KEY = "_consensus/term-floor"
#: A migration's marker (``consensus_api.bridging.Marker``), on the old store and copied to the new.
MARKER_KEY = "_consensus/migration"
#: Keys of the migration machinery itself: never copied, compared or counted as data.
RESERVED_KEYS = frozenset({FLOOR_KEY, MARKER_KEY})

_FLOOR_TARGET = Target(TargetKind.VALUE, FLOOR_KEY)

BackendFactory = Callable[[BackendURL, Options, BackendEvents], Backend]


def parse_floor(found: Versioned | None) -> int:
    """The floor a fetched ``FLOOR_KEY`` holds (0 when absent); ``ConsensusError`` if malformed."""
    if found is None:
        return 0
    try:
        floor = int(found.value.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        raise ConsensusError(f"{FLOOR_KEY} holds {found.value[:40]!r}, not a decimal term floor") from None
    if not 0 <= floor <= MAX_VERSION:
        raise ConsensusError(f"{FLOOR_KEY} holds {floor}, outside 0..2**63-1")
    return floor


def raise_floor(backend: Backend, at_least: int) -> int:
    """Make the store's floor at least ``at_least`` (never lower it) and return it.

    ``backend`` is a ``FloorBackend`` or a native one. Refused with ``ConsensusError`` before any
    write when the store's native ceiling plus the new floor would pass ``2**63 - 1``.
    """
    native = backend.inner if isinstance(backend, FloorBackend) else backend
    if not isinstance(at_least, int) or isinstance(at_least, bool) or not 0 <= at_least <= MAX_VERSION:
        raise ConsensusError(f"a term floor must be an int from 0 to 2**63-1, got {at_least!r}")
    while True:
        found = native.fetch(FLOOR_KEY)
        current = parse_floor(found)
        if current >= at_least:
            floor = current
            break
        if native.term_ceiling() + at_least > MAX_VERSION:
            raise ConsensusError(
                f"a term floor of {at_least} would push this store's terms past 2**63-1; nothing was written"
            )
        text = str(at_least).encode("ascii")
        try:
            if found is None:
                native.put(FLOOR_KEY, text, None)
            else:
                native.update(FLOOR_KEY, text, found.version, None)
        except (KeyExistsError, VersionConflictError):
            continue  # another writer raised it meanwhile: read again
        floor = at_least
        break
    if isinstance(backend, FloorBackend):
        backend.refresh_floor()
    return floor


class FloorBackend(Backend):
    """A backend seen through its store's term floor (module docstring); everything else delegates."""

    def __init__(
        self, inner_factory: BackendFactory, url: BackendURL, options: Options, events: BackendEvents
    ):
        super().__init__(url, options, events)
        self._lock = threading.Lock()
        self._floor = 0
        self._stale = True
        self._elections: set[str] = set()
        self._user_watches_floor = False
        self.inner = inner_factory(url, options, FloorEvents(self, events))

    def __getattr__(self, name: str) -> Any:
        # Backend-specific attributes (tests and tools reach them through ``session._backend``).
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def floor(self) -> int:
        """The floor as last read."""
        return self._floor

    @property
    def stale(self) -> bool:
        """Whether a change of the floor was reported since it was last read."""
        return self._stale

    def floor_target(self) -> Target:
        """The watched floor key."""
        return _FLOOR_TARGET

    def reports_floor_changes(self) -> bool:
        """Whether the application watches the floor key itself (its changes then reach it)."""
        return self._user_watches_floor

    def note_floor(self, value: Versioned | None) -> int:
        """Take ``value``, a fresh read of the floor key, as the floor (it only rises); the floor."""
        floor = parse_floor(value)
        with self._lock:
            self._floor = max(self._floor, floor)
            self._stale = False  # a change reported meanwhile is read again by the next call
            return self._floor

    def refresh_floor(self) -> int:
        """Read the floor now (a linearizable read) and return it."""
        with self._lock:
            self._stale = False
        try:
            floor = parse_floor(self.inner.fetch(FLOOR_KEY))
        except BaseException:
            with self._lock:
                self._stale = True
            raise
        with self._lock:
            self._floor = max(self._floor, floor)
            return self._floor

    def current_floor(self) -> int:
        """The floor, read afresh when a change was reported since the last read."""
        return self.refresh_floor() if self._stale else self._floor

    def lift(self, native: Leadership | None, floor: int | None = None) -> Leadership | None:
        """``native`` with its term raised by the floor."""
        if native is None:
            return None
        term = native.term + (self.current_floor() if floor is None else floor)
        if term > MAX_VERSION:
            raise ConsensusError(f"term {term} of {native.service!r} passes 2**63-1 (term floor too high)")
        return Leadership(native.service, native.leader_id, term)

    def lower(self, fence: Leadership | None, floor: int | None = None) -> Leadership | None:
        """The native fence for ``fence``; ``FencedError`` for a term issued below the floor."""
        if fence is None:
            return None
        floor = self.current_floor() if floor is None else floor
        if fence.term <= floor:
            raise FencedError(
                f"the leadership of {fence.service!r} with term {fence.term} predates this store's "
                f"term floor {floor} (issued before a migration's cut-over or on another store)"
            )
        return Leadership(fence.service, fence.leader_id, fence.term - floor)

    def lift_version(self, native: Versioned | None, floor: int | None = None) -> Versioned | None:
        """``native`` with its version raised by the floor."""
        if native is None:
            return None
        return Versioned(native.value, native.version + (self.current_floor() if floor is None else floor))

    def lower_version(self, key: str, version: int | None, floor: int | None = None) -> int | None:
        """The native expected version for ``version``; one at most the floor never matches
        (``VersionConflictError``, ``KeyNotFoundError`` for an absent key)."""
        if version is None:
            return None
        floor = self.current_floor() if floor is None else floor
        if version > floor:
            return version - floor
        raise version_refusal(key, version, floor, exists=self.inner.fetch(key) is not None)

    # Lifecycle and state.

    def open(self) -> None:
        self.inner.open()
        self.inner.watch(_FLOOR_TARGET)
        self.refresh_floor()

    def close(self) -> None:
        self.inner.close()

    def floor_changed(self) -> None:
        with self._lock:
            self._stale = True
            elections = list(self._elections)
        for service in elections:
            self.events.changed(Target(TargetKind.ELECTION, service))

    # Storage.

    def fetch(self, key: str) -> Versioned | None:
        return self.lift_version(self.inner.fetch(key))

    def put(self, key: str, value: bytes, fence: Leadership | None) -> int:
        floor = self.current_floor()
        return self.inner.put(key, value, self.lower(fence, floor)) + floor

    def update(self, key: str, value: bytes, version: int | None, fence: Leadership | None) -> int:
        floor = self.current_floor()
        native = self.lower_version(key, version, floor)
        return self.inner.update(key, value, native, self.lower(fence, floor)) + floor

    def delete(self, key: str, version: int | None, fence: Leadership | None) -> None:
        floor = self.current_floor()
        self.inner.delete(key, self.lower_version(key, version, floor), self.lower(fence, floor))

    def keys(self, namespace: str) -> frozenset[str]:
        return self.inner.keys(namespace)

    def walk(self, namespace: str) -> Iterator[tuple[str, Versioned]]:
        floor = self.current_floor()
        return (
            (key, Versioned(found.value, found.version + floor)) for key, found in self.inner.walk(namespace)
        )

    # Groups and elections.

    def join(self, group: str, member_id: str, data: bytes) -> None:
        self.inner.join(group, member_id, data)

    def leave(self, group: str, member_id: str) -> None:
        self.inner.leave(group, member_id)

    def membership(self, group: str) -> dict[str, bytes]:
        return self.inner.membership(group)

    def nominate(self, service: str, candidate_id: str) -> bool:
        return self.inner.nominate(service, candidate_id)

    def resign(self, service: str, candidate_id: str) -> None:
        self.inner.resign(service, candidate_id)

    def leadership(self, service: str) -> Leadership | None:
        return self.lift(self.inner.leadership(service))

    # Watches and the fast paths.

    def watch(self, target: Target) -> None:
        if target == _FLOOR_TARGET:
            self._user_watches_floor = True
            return
        if target.kind is TargetKind.ELECTION:
            with self._lock:
                self._elections.add(target.name)
        self.inner.watch(target)

    def unwatch(self, target: Target) -> None:
        if target == _FLOOR_TARGET:
            self._user_watches_floor = False
            return
        if target.kind is TargetKind.ELECTION:
            with self._lock:
                self._elections.discard(target.name)
        self.inner.unwatch(target)

    def change_reader(self) -> Reader:
        return FloorReader(self, self.inner.change_reader())

    def nowait_reader(self) -> Reader | None:
        reader = self.inner.nowait_reader()
        return None if reader is None else FloorNowaitReader(self, reader)

    def nowait_writer(self) -> Writer | None:
        writer = self.inner.nowait_writer()
        return None if writer is None else FloorWriter(self, writer)

    def async_storage(self) -> AsyncStorage | None:
        storage = self.inner.async_storage()
        return None if storage is None else FloorAsyncStorage(self, storage)

    # Everything else, as the backend does it.

    def server_version(self) -> str | None:
        return self.inner.server_version()

    def term_ceiling(self) -> int:
        return self.inner.term_ceiling() + self.current_floor()

    def seal(self) -> None:
        self.inner.seal()

    def unseal(self) -> None:
        self.inner.unseal()

    def sealed(self) -> bool:
        return self.inner.sealed()

    def session_identity(self) -> str:
        return self.inner.session_identity()

    def live_sessions(self) -> frozenset[str] | None:
        return self.inner.live_sessions()

    def fault_identity(self) -> Any:
        return self.inner.fault_identity()

    def coordinator_engine(self, group: str, protocol_type: str, host: Any, rebalance_timeout: float) -> Any:
        return self.inner.coordinator_engine(group, protocol_type, host, rebalance_timeout)

    def describe_coordinator_group(self, group: str) -> Any:
        return self.inner.describe_coordinator_group(group)
