"""A migration's marker: which store has authority (docs/migration.md, "the bridged phase").

The marker is JSON at ``MARKER_KEY`` on each store. The rule every bridged session and the tools
follow: authority is the old store's, unless the old store's marker is in phase ``cutover`` (written
just before the old store is sealed) and the new store's marker carries the same migration id and
``authority: "new"`` (written last by the cut-over, once the data and the term floor are in place).
A roll-back writes phase ``rolled-back`` on the old store, which hands authority back whatever the
new store's marker says; a cut-over that fails after sealing writes ``aborted``.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from dataclasses import asdict, dataclass, replace

from consensus_api.backend import Backend
from consensus_api.errors import ConsensusError
from consensus_api.floor import MARKER_KEY
from consensus_api.model import Versioned

CUTOVER = "cutover"
ROLLED_BACK = "rolled-back"
ABORTED = "aborted"
OLD = "old"
NEW = "new"
#: Where sessions announce themselves to a cut-over (member data: ``announcement``).
BRIDGED_GROUP = "_consensus/bridged"


@dataclass(frozen=True, slots=True)
class Marker:
    """One store's view of a migration: ``phase``, ``authority`` (``old``/``new``), the target URL
    (redacted), the floor set on the new store and ``fingerprint``, the digest of the new store's
    keys and versions when it took authority (how a roll-back knows it accepted no write)."""

    id: str
    phase: str
    authority: str
    target: str
    started: float
    updated: float
    floor: int = 0
    fingerprint: str = ""

    def encode(self) -> bytes:
        """The JSON stored at ``MARKER_KEY``."""
        return json.dumps(asdict(self), sort_keys=True).encode("utf-8")

    def moved(self, **changes: object) -> Marker:
        """This marker with ``changes`` and a fresh ``updated`` time."""
        return replace(self, updated=time.time(), **changes)  # type: ignore[arg-type]

    @classmethod
    def decode(cls, found: Versioned | None) -> Marker | None:
        """The marker a fetched ``MARKER_KEY`` holds, or None; ``ConsensusError`` if malformed."""
        if found is None:
            return None
        try:
            data = json.loads(found.value)
            return cls(**{name: data[name] for name in cls.__dataclass_fields__ if name in data})
        except (ValueError, TypeError, KeyError):
            raise ConsensusError(f"{MARKER_KEY} holds {found.value[:60]!r}, not a migration marker") from None


def authority(old_marker: Marker | None, new_marker: Marker | None) -> str:
    """``old`` or ``new``: who has authority given both markers (module docstring)."""
    if old_marker is None or old_marker.phase != CUTOVER:
        return OLD
    if new_marker is not None and new_marker.id == old_marker.id and new_marker.authority == NEW:
        return NEW
    return OLD


def announcement(identity: str, *, role: str = "client", parked: bool = False) -> bytes:
    """The member data a session announces in ``BRIDGED_GROUP``; ``parked``: it holds nothing on the
    store and takes nothing there until the cut-over under way ends (``BridgeBackend``)."""
    data = {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "session": identity,
        "bridged": True,
        "role": role,
        "parked": parked,
    }
    return json.dumps(data, sort_keys=True).encode("utf-8")


def announce(backend: Backend, *, role: str = "client", parked: bool = False) -> str:
    """Join ``BRIDGED_GROUP`` on ``backend`` with a fresh member id (returned)."""
    member_id = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    data = announcement(backend.session_identity(), role=role, parked=parked)
    backend.join(BRIDGED_GROUP, member_id, data)
    return member_id


def unparked_clients(members: dict[str, bytes]) -> list[str]:
    """The member ids of bridged client sessions in ``members`` (``BRIDGED_GROUP``) not parked."""
    found = []
    for member_id, data in members.items():
        try:
            decoded = json.loads(data)
        except ValueError:
            continue
        if isinstance(decoded, dict) and decoded.get("role") == "client" and not decoded.get("parked"):
            found.append(member_id)
    return found
