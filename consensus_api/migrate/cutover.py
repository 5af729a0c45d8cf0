"""The cut-over and the roll-back of a bridged migration.

Contract: <https://consensus-api.github.io/consensus-api/spec/#14-migration-between-backends>

``cutover(old, new)``, in order, each step guaranteeing what the next relies on:

1. Refuses (``CutoverRefusedError``, nothing changed) while authority is already on the new store,
   while a live session on the old store is not bridged (``Backend.live_sessions`` minus the members
   of ``BRIDGED_GROUP`` minus the tool's own sessions; a store that cannot list them is refused
   unless ``force``), or while the data is not *in sync*: a verify of old against new finds a path
   the new store cannot hold, or more than ``max_lag`` differences (a follower that keeps up leaves
   only the last moments' changes).
2. Writes the marker on the old store in phase ``cutover`` (authority still old): bridged sessions
   park (give up every candidacy and member there, take none; ``consensus_api.bridging``), open the
   new store and watch its marker. Waits, within ``timeout``, until every bridged client announces
   itself parked; else marks the old store ``aborted`` (they un-park) and refuses.
3. Seals the old store: from then on no write is accepted there (``SealedError``).
4. Copies what is left (the old store no longer changes) and verifies until no difference remains,
   within ``timeout``; else un-seals, marks the old store ``aborted`` and refuses.
5. Raises the new store's floor to the old store's ceiling (its term ceiling and its highest
   version, with its floor), so every term, token and version the new store reports from now on is
   greater than any the old one did (a compare-and-set decided on the old store never matches on
   the new one)
   to a session that heard of it: bridged sessions parked before the ceiling was read, and every
   live session was bridged (without ``force``).
6. Writes the marker on the new store with ``authority: "new"`` and the fingerprint of its data:
   bridged sessions move (``LOST``, then ``CONNECTED`` on the new store).

``rollback(old, new)`` seals the new store, and proceeds only if its fingerprint still equals the
one taken at the cut-over (no key written, created or deleted since: it accepted no write); then it
un-seals the old store, raises the old store's floor above the new store's ceiling (tokens keep
rising) and marks the old store ``rolled-back``: bridged sessions move back. Otherwise it un-seals
the new store and refuses (``RollbackRefusedError``), naming the keys that differ.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from typing import Any

from consensus_api.errors import ConfigurationError, ConsensusError
from consensus_api.floor import raise_floor
from consensus_api.marker import (
    ABORTED,
    BRIDGED_GROUP,
    CUTOVER,
    NEW,
    OLD,
    ROLLED_BACK,
    Marker,
    authority,
    unparked_clients,
)
from consensus_api.migrate.copying import Migration
from consensus_api.migrate.stores import Store, check_timeout, opened

__all__ = ["CutoverRefusedError", "RollbackRefusedError", "cutover", "own_sessions", "rollback"]

#: Keys named in a refusal.
SHOWN = 5
#: Seconds between two reads of the bridged sessions while waiting for them to park.
PARK_POLL = 0.05


class CutoverRefusedError(ConsensusError):
    """The cut-over did not happen; authority stays on the old store and the message says why."""


class RollbackRefusedError(ConsensusError):
    """The roll-back did not happen; authority stays on the new store and the message says why."""


def own_sessions(old: Store) -> set[str]:
    """The tool's own session on the old store."""
    return {old.backend.session_identity()}


def cutover(
    old: str,
    new: str,
    *,
    force: bool = False,
    timeout: float = 60.0,
    max_lag: int = 1000,
    options: Mapping[str, Any] | None = None,
) -> Marker:
    """Hand authority from ``old`` to ``new`` (module docstring); the marker written on ``new``."""
    deadline = time.monotonic() + check_timeout(timeout)
    if not isinstance(force, bool):
        raise ConfigurationError(f"force must be a bool, not {force!r}")
    if isinstance(max_lag, bool) or not isinstance(max_lag, int) or max_lag < 0:
        raise ConfigurationError(f"max_lag must be an int >= 0, not {max_lag!r}")
    with opened(old, new, options) as (migration, old_store, new_store):
        return _cutover(old_store, new_store, migration, force=force, deadline=deadline, max_lag=max_lag)


def _cutover(
    old: Store, new: Store, migration: Migration, *, force: bool, deadline: float, max_lag: int
) -> Marker:
    old_marker, new_marker = old.marker(), new.marker()
    if authority(old_marker, new_marker) == NEW:
        raise CutoverRefusedError(f"authority is already on the new store ({new.url.redacted()})")
    resuming = old_marker is not None and old_marker.phase == CUTOVER
    _check_sessions(old, own_sessions(old), force)
    if not resuming:
        _check_sync(migration, max_lag)
    if new.backend.sealed():
        new.backend.unseal()  # left sealed by an earlier roll-back
    now = time.time()
    marker = (
        old_marker
        if resuming and old_marker is not None
        else Marker(uuid.uuid4().hex, CUTOVER, OLD, new.url.redacted(), now, now)
    )
    if not resuming:
        old.write_marker(marker)
    try:
        _await_parked(old, deadline)
    except BaseException:
        old.write_marker(marker.moved(phase=ABORTED))
        raise
    old.backend.seal()
    try:
        _catch_up(migration, deadline)
        floor = raise_floor(new.backend, ceiling(old))
        done = marker.moved(authority=NEW, floor=floor, fingerprint=new.fingerprint())
        new.write_marker(done)
    except BaseException:
        old.backend.unseal()
        old.write_marker(marker.moved(phase=ABORTED))
        raise
    return done


def ceiling(store: Store) -> int:
    """At least every term, token and version ``store`` has reported: its term ceiling and the
    highest version of its keys (both with its floor)."""
    versions = (found.version for _, found in store.backend.walk(""))
    return max(store.backend.term_ceiling(), max(versions, default=0))


def _await_parked(old: Store, deadline: float) -> None:
    """Return once no bridged client on the old store is un-parked; ``CutoverRefusedError`` at
    ``deadline``."""
    while unparked := unparked_clients(old.backend.membership(BRIDGED_GROUP)):
        if time.monotonic() >= deadline:
            raise CutoverRefusedError(
                f"{len(unparked)} bridged sessions did not park for the cut-over in time; the old store "
                "keeps authority (they take part there again)"
            )
        time.sleep(PARK_POLL)


def _check_sessions(old: Store, own: set[str], force: bool) -> None:
    unbridged = old.unbridged(own)
    if unbridged is None and not force:
        raise CutoverRefusedError(
            f"the old store ({old.backend.name}) cannot list its live sessions, so the cut-over cannot "
            "check that every client is bridged; make sure they are, then use force=True (--force)"
        )
    if unbridged:
        shown = ", ".join(unbridged[:SHOWN]) + (" ..." if len(unbridged) > SHOWN else "")
        raise CutoverRefusedError(
            f"{len(unbridged)} live sessions on the old store are not bridged ({shown}): restart those "
            "clients with migrate_to (or stop them) first; `consensus migrate status` lists them"
        )


def _check_sync(migration: Migration, max_lag: int) -> None:
    report = migration.verify()
    unholdable = [d.key for d in report.differences if d.kind == "unholdable"]
    if unholdable:
        raise CutoverRefusedError(
            f"{len(unholdable)} keys of the old store cannot be held by the new one: {unholdable[:SHOWN]}"
        )
    if len(report.differences) > max_lag:
        raise CutoverRefusedError(
            f"the data is not in sync: {len(report.differences)} keys differ (at most {max_lag} allowed); "
            "run `consensus migrate --from OLD --to NEW --follow` until it reports in sync"
        )


def _catch_up(migration: Migration, deadline: float) -> None:
    """Copy and verify until the new store holds every key of the (sealed) old one."""
    while True:
        migration.copy()
        differences = migration.verify().differences
        if not differences:
            return
        if time.monotonic() >= deadline:
            keys = [d.key for d in differences[:SHOWN]]
            raise CutoverRefusedError(
                f"the new store did not catch up in time: {len(differences)} keys still differ "
                f"({keys}); the old store was un-sealed and keeps authority"
            )
        time.sleep(0.2)


def rollback(old: str, new: str, *, options: Mapping[str, Any] | None = None) -> Marker:
    """Hand authority back to ``old`` while ``new`` has accepted no write (module docstring)."""
    with opened(old, new, options) as (migration, old_store, new_store):
        return _rollback(old_store, new_store, migration)


def _rollback(old: Store, new: Store, migration: Migration) -> Marker:
    old_marker, new_marker = old.marker(), new.marker()
    if old_marker is None or old_marker.phase != CUTOVER:
        phase = "none" if old_marker is None else old_marker.phase
        raise RollbackRefusedError(f"there is no cut-over to roll back (the old store's phase: {phase})")
    if authority(old_marker, new_marker) == NEW and new_marker is not None:
        new.backend.seal()
        if new.fingerprint() != new_marker.fingerprint:
            new.backend.unseal()
            raise RollbackRefusedError(
                "the new store accepted writes since the cut-over (its keys or versions changed"
                f"{_changed_keys(migration)}); authority stays on it: rolling back would lose them"
            )
    old.backend.unseal()
    raise_floor(old.backend, ceiling(new))
    rolled = old_marker.moved(phase=ROLLED_BACK, authority=OLD)
    old.write_marker(rolled)
    return rolled


def _changed_keys(migration: Migration) -> str:
    keys = [d.key for d in migration.verify().differences]
    return f": {keys[:SHOWN]}" if keys else ""
