"""The faces of a ``FloorBackend`` besides its own calls (``consensus_api.floor``): its backend's
reports, change reader, no-wait reader and writer, and asyncio storage, each translating terms,
fences and versions by the store's floor as the backend's own calls do."""

from __future__ import annotations

from typing import Protocol

from consensus_api.backend import AsyncStorage, BackendEvents, Reader, Target, WouldBlock, Writer
from consensus_api.errors import ConsensusError, KeyNotFoundError, VersionConflictError
from consensus_api.model import Leadership, SessionState, Versioned


class Floored(Protocol):
    """What the views need of their ``FloorBackend``."""

    @property
    def floor(self) -> int: ...

    @property
    def stale(self) -> bool: ...

    def floor_target(self) -> Target: ...

    def floor_changed(self) -> None: ...

    def reports_floor_changes(self) -> bool: ...

    def note_floor(self, value: Versioned | None) -> int: ...

    def lift(self, native: Leadership | None, floor: int | None = None) -> Leadership | None: ...

    def lower(self, fence: Leadership | None, floor: int | None = None) -> Leadership | None: ...

    def lift_version(self, native: Versioned | None, floor: int | None = None) -> Versioned | None: ...

    def lower_version(self, key: str, version: int | None, floor: int | None = None) -> int | None: ...


class FloorEvents:
    """The inner backend's reports: a floor change marks the floor stale and re-reports elections."""

    def __init__(self, owner: Floored, events: BackendEvents) -> None:
        self._owner = owner
        self._events = events

    def state_changed(self, state: SessionState) -> None:
        if state is SessionState.CONNECTED:
            self._owner.floor_changed()  # a change during the outage may have gone unreported
        self._events.state_changed(state)

    def changed(self, target: Target) -> None:
        if target == self._owner.floor_target():
            self._owner.floor_changed()
            if not self._owner.reports_floor_changes():
                return
        self._events.changed(target)


class FloorReader:
    """A reader whose terms and versions carry the floor."""

    def __init__(self, owner: Floored, reader: Reader) -> None:
        self._owner = owner
        self._reader = reader
        self.keys = reader.keys
        self.membership = reader.membership

    def fetch(self, key: str) -> Versioned | None:
        return self._owner.lift_version(self._reader.fetch(key))

    def leadership(self, service: str) -> Leadership | None:
        return self._owner.lift(self._reader.leadership(service))


class FloorNowaitReader(FloorReader):
    """A no-wait reader: the floor already read, else ``WouldBlock``."""

    def fetch(self, key: str) -> Versioned | None:
        return self._owner.lift_version(self._reader.fetch(key), cached_floor(self._owner))

    def leadership(self, service: str) -> Leadership | None:
        return self._owner.lift(self._reader.leadership(service), cached_floor(self._owner))


def version_refusal(key: str, version: int, floor: int, *, exists: bool) -> ConsensusError:
    """The error for an expected ``version`` at most the ``floor``: it never matches."""
    if not exists:
        return KeyNotFoundError(f"no key {key!r}")
    return VersionConflictError(
        f"{key!r} is not at version {version}: that version predates this store's floor {floor} "
        "(read before a migration's cut-over, or on another store); read the key again"
    )


def cached_floor(owner: Floored) -> int:
    """The floor as read, for a call that must not wait; ``WouldBlock`` when it must be read first."""
    if owner.stale:
        raise WouldBlock("the floor must be read first")
    return owner.floor


class FloorWriter:
    """A no-wait writer translating with the floor already read (else ``WouldBlock``)."""

    def __init__(self, owner: Floored, writer: Writer) -> None:
        self._owner = owner
        self._writer = writer

    def put(self, key: str, value: bytes, fence: Leadership | None) -> int:
        floor = cached_floor(self._owner)
        return self._writer.put(key, value, self._owner.lower(fence, floor)) + floor

    def update(self, key: str, value: bytes, version: int | None, fence: Leadership | None) -> int:
        floor = cached_floor(self._owner)
        if version is not None and version <= floor:
            raise WouldBlock("a version below the floor is refused by the ordinary call")
        native = self._owner.lower_version(key, version, floor)
        return self._writer.update(key, value, native, self._owner.lower(fence, floor)) + floor

    def delete(self, key: str, version: int | None, fence: Leadership | None) -> None:
        floor = cached_floor(self._owner)
        if version is not None and version <= floor:
            raise WouldBlock("a version below the floor is refused by the ordinary call")
        native = self._owner.lower_version(key, version, floor)
        self._writer.delete(key, native, self._owner.lower(fence, floor))


class FloorAsyncStorage:
    """A backend's asyncio storage translating with the floor (read afresh when stale)."""

    def __init__(self, owner: Floored, storage: AsyncStorage) -> None:
        self._owner = owner
        self._storage = storage
        self.keys = storage.keys
        self.aclose = storage.aclose

    async def _floor(self) -> int:
        owner = self._owner
        if owner.stale:
            return owner.note_floor(await self._storage.fetch(owner.floor_target().name))
        return owner.floor

    async def _lower_version(self, key: str, version: int | None, floor: int) -> int | None:
        if version is None:
            return None
        if version <= floor:
            raise version_refusal(key, version, floor, exists=await self._storage.fetch(key) is not None)
        return version - floor

    async def fetch(self, key: str) -> Versioned | None:
        floor = await self._floor()
        return self._owner.lift_version(await self._storage.fetch(key), floor)

    async def put(self, key: str, value: bytes, fence: Leadership | None) -> int:
        floor = await self._floor()
        return await self._storage.put(key, value, self._owner.lower(fence, floor)) + floor

    async def update(self, key: str, value: bytes, version: int | None, fence: Leadership | None) -> int:
        floor = await self._floor()
        native = await self._lower_version(key, version, floor)
        return await self._storage.update(key, value, native, self._owner.lower(fence, floor)) + floor

    async def delete(self, key: str, version: int | None, fence: Leadership | None) -> None:
        floor = await self._floor()
        native = await self._lower_version(key, version, floor)
        await self._storage.delete(key, native, self._owner.lower(fence, floor))
