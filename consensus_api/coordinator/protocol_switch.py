"""Online migration of a resource group between the classic protocol (``ResourceHandler``, eager or
cooperative) and the incremental one (``incremental_coordinator``), by rolling restarts.

The two modes keep separate state, so each member of one mode defers to the
other mode while it still runs the resources (a *gate*; a gated member
subscribes to nothing and so owns nothing):

* an incremental member starting while the classic group has live members is
  gated until the classic group is empty; once it took part it never defers
  again;
* a classic member joining while a live incremental member holds resources is
  gated until no live incremental member does (checked at every join).

Rolling a settled group one member at a time, the members of the old mode
keep every resource until the last of them leaves (revoking what it ran);
then the new mode's members take them in one rebalance. A resource is never
owned by members of both modes at once (a crashed member counts as live until
its session expires). Both modes starting from scratch at the same moment is
not a migration and is not covered.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from consensus_api.coordinator.generic.reconcile import GroupState
from consensus_api.coordinator.generic.records import IncrementalLayout, Layout

if TYPE_CHECKING:
    from consensus_api._session_port import SessionPort

#: Seconds between two checks of a gate while it is closed.
POLL = 0.5


def classic_members_live(session: SessionPort, group: str) -> bool:
    """True if the classic group ``group`` has a live member (the backend's own engine's view, else
    the generic engine's membership)."""
    backend = session.backend_for_call()
    own = backend.describe_coordinator_group(group)
    if own is not None:
        return bool(own.members)
    return bool(backend.membership(Layout(group).root))


def incremental_holders_live(session: SessionPort, group: str) -> bool:
    """True if a live member of the incremental group ``group`` holds a resource."""
    backend = session.backend_for_call()
    live = backend.membership(IncrementalLayout(group).root)
    if not live:
        return False
    stored = backend.fetch(IncrementalLayout(group).state)
    state = GroupState.decode(stored.value) if stored is not None else None
    if state is None:
        return False
    return any(member in live and entry.held for member, entry in state.members.items())


class Gate:
    """Whether a member defers to the other mode; rechecked at most every ``POLL`` seconds."""

    def __init__(self) -> None:
        self.closed = False
        self._checked = 0.0

    def due(self) -> bool:
        """True if the closed gate should be checked again now."""
        return self.closed and time.monotonic() - self._checked >= POLL

    def set(self, closed: bool) -> bool:
        """Record a check; True if the gate just opened."""
        opened = self.closed and not closed
        self.closed, self._checked = closed, time.monotonic()
        return opened
