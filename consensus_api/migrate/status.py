"""Where a bridged migration stands (``consensus migrate status``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from consensus_api.marker import ABORTED, CUTOVER, NEW, ROLLED_BACK, Marker, authority
from consensus_api.migrate.cutover import own_sessions
from consensus_api.migrate.stores import opened

#: The phases ``status`` reports.
NOT_STARTED = "not-started"
CUTTING_OVER = "cutting-over"
CUT_OVER = "cut-over"


@dataclass
class MigrationStatus:
    """A snapshot of both stores.

    ``phase``: ``not-started`` (no cut-over yet; bridged sessions may be rolling out),
    ``cutting-over`` (the old store is sealed, authority not handed over yet: running, or
    interrupted: run ``cutover`` or ``rollback`` again), ``cut-over``, ``rolled-back`` or ``aborted``.
    ``bridged_old``/``bridged_new``: the announcements of bridged sessions (and followers) on each
    store; ``unbridged``: live sessions on the old store that announce no bridge (None: the store
    cannot list them); ``lag``: keys that differ between the stores.
    """

    phase: str
    authority: str
    sealed_old: bool
    sealed_new: bool
    floor_old: int
    floor_new: int
    lag: int
    unbridged: list[str] | None
    bridged_old: list[dict[str, Any]] = field(default_factory=list)
    bridged_new: list[dict[str, Any]] = field(default_factory=list)
    marker_old: Marker | None = None
    marker_new: Marker | None = None

    def as_json(self) -> dict[str, Any]:
        """A JSON-able dict (``--json``)."""
        return asdict(self)


def status(old: str, new: str, *, options: Mapping[str, Any] | None = None) -> MigrationStatus:
    """Read both stores; writes nothing."""
    with opened(old, new, options) as (migration, old_store, new_store):
        old_marker, new_marker = old_store.marker(), new_store.marker()
        return MigrationStatus(
            phase=_phase(old_marker, new_marker),
            authority=authority(old_marker, new_marker),
            sealed_old=old_store.backend.sealed(),
            sealed_new=new_store.backend.sealed(),
            floor_old=old_store.floor(),
            floor_new=new_store.floor(),
            lag=len(migration.verify().differences),
            unbridged=old_store.unbridged(own_sessions(old_store)),
            bridged_old=list(old_store.announcements().values()),
            bridged_new=list(new_store.announcements().values()),
            marker_old=old_marker,
            marker_new=new_marker,
        )


def _phase(old_marker: Marker | None, new_marker: Marker | None) -> str:
    if old_marker is None:
        return NOT_STARTED
    if old_marker.phase == CUTOVER:
        return CUT_OVER if authority(old_marker, new_marker) == NEW else CUTTING_OVER
    if old_marker.phase in (ROLLED_BACK, ABORTED):
        return old_marker.phase
    return NOT_STARTED
