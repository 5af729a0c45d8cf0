"""A static member's hold on its instance (KIP-345): one start of a ``group_instance_id`` at a time.

Each start of a static :class:`~.core.Coordinator` first *claims* the instance
(the key ``_static/<s>/<instance>`` names the start; the last claim wins), then
takes its *seat*: the member ``<instance>`` of the membership group
``_static/<s>``, which one live session at a time can hold. The coordinator
runs its engine (the generic group, or Kafka's JoinGroup) only while it holds
the seat, and gives the seat up last, after it stopped everything and left the
group. So:

* a newer start asks nothing of the group while an older start holds the seat;
* an older start that sees the claim name another start is *superseded*: it
  drops what it holds (``on_join_prepare(-1, "")``), leaves, then frees the
  seat, and its ``ensure_active_group`` raises ``FencedError``;
* an older start that cannot do so (frozen, cut off, killed) keeps the seat
  until the store ends its session (``session_timeout`` plus the backend's
  detection delay); when it resumes it learns of the loss and drops everything.

A newer start therefore gets nothing the older one owned before the older one
stopped it, or lost its session. It is not bounded by ``rebalance_timeout``: an
older start alive but stuck in a callback keeps the seat. The seat is not
re-joined by the session after a loss (``rejoin=False``): the coordinator takes
it again from its thread, after it has checked the claim.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

from consensus_api.coordinator.generic.loop import Mirror, store, value_mirror
from consensus_api.coordinator.generic.records import Layout
from consensus_api.errors import MemberExistsError, NotAMemberError
from consensus_api.membership import GroupMembership
from consensus_api.model import MembershipChanged, ValueChanged
from consensus_api.storage import Storage

if TYPE_CHECKING:
    from consensus_api._session_port import SessionPort

log = logging.getLogger("consensus_api.coordinator")


class InstanceSeat:
    """One start's claim and seat of ``instance`` in ``group``; used on the coordinator thread."""

    def __init__(self, session: SessionPort, group: str, instance: str, wake: Callable[[], None]) -> None:
        layout = Layout(group)
        self._session = session
        self._root = layout.instances
        self._key = layout.instance(instance)
        self._instance = instance
        self._start = uuid.uuid4().hex.encode()
        self._storage = Storage(session)
        self._claim: Mirror[ValueChanged] = value_mirror(session, self._key, wake)
        seats = GroupMembership(session, self._root)
        self._seats: Mirror[MembershipChanged] = Mirror(seats.add_listener, seats.remove_listener, wake)
        self._claimed = False
        self._held = False

    def take(self) -> bool:
        """Claim the instance (at the first call), then take the seat once nobody holds it; True
        while this start holds it. Call ``superseded`` first."""
        if not self._claimed:
            store(self._storage, self._key, self._start)
            self._claimed = True
            self._claim.start()  # its first read follows the claim
            self._seats.start()
        if self._held:
            return True
        seats = self._seats.event
        if seats is None or self._instance in seats.members:
            return False  # an older start (or this one before a session loss) holds it: wait
        try:
            self._session.join(self._root, self._instance, self._start, rejoin=False)
        except MemberExistsError:
            return False
        self._held = True
        return True

    def superseded(self) -> bool:
        """True once a later start claimed the instance."""
        event = self._claim.event
        return event is not None and event.value not in (None, self._start)

    def lost(self) -> None:
        """The session was lost, and the seat with it: ``take`` must take it again."""
        self._held = False

    def release(self) -> None:
        """Give the seat up (best effort) and stop following the claim; call after everything held
        was dropped and the group left."""
        self._claim.stop()
        self._seats.stop()
        if not self._held:
            return
        self._held = False
        try:
            self._session.leave(self._root, self._instance)
        except NotAMemberError:
            pass
        except Exception as exc:
            log.info("giving up the seat of instance %r failed (%s)", self._instance, exc)
