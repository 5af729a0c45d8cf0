"""The steward of an incremental group: KIP-848's group coordinator, run by the member that leads
the group's election, on its own thread.

It keeps the group state blob (:mod:`reconcile`) at ``<root>/state``: it
watches the membership (member data = the digest of its subscription), every member's
acknowledgement ``<root>/owned/<member>``, and re-runs :func:`reconcile` after
every change. A member's subscription is the one its membership data names,
or the newer one its acknowledgement names (``update_resources``). A static
member (id ``i-<instance>``) that is gone stays in the group for the
steward's session timeout, holding its entry, so a restart within it
disturbs nobody. Each write replaces the whole blob, compared with its version
and fenced by the steward's leadership, so member entries and ownership change
together and a deposed steward changes nothing. A member that does not
acknowledge a revocation within ``rebalance_timeout`` is fenced (the deadline
counts from the store's last return at the earliest, and a prompt read must
show the acknowledgement still missing: :mod:`.elected`). Members that
left are dropped and their acknowledgements deleted.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from typing import TYPE_CHECKING

from consensus_api.assignors import Assignor
from consensus_api.coordinator.generic.elected import IDLE, ElectedRunner
from consensus_api.coordinator.generic.loop import Mirror, value_mirror
from consensus_api.coordinator.generic.reconcile import UNREVOKED, Ack, GroupState, digest, reconcile
from consensus_api.coordinator.generic.records import IncrementalLayout
from consensus_api.errors import ConsensusError, KeyExistsError, KeyNotFoundError
from consensus_api.model import Leadership, MembershipChanged, ValueChanged
from consensus_api.storage import Storage

if TYPE_CHECKING:
    from consensus_api._session_port import SessionPort

log = logging.getLogger("consensus_api.coordinator")


def publish_subscription(storage: Storage, layout: IncrementalLayout, resources: frozenset[str]) -> bytes:
    """Store ``resources`` under their digest (once per distinct set); the membership data naming it."""
    fingerprint = digest(resources)
    with contextlib.suppress(KeyExistsError):
        storage.put(layout.subscription(fingerprint), json.dumps(sorted(resources)).encode())
    return fingerprint.encode()


class Steward(ElectedRunner[GroupState]):
    """Runs while its member leads the group's election (``lead``); idle otherwise."""

    def __init__(
        self, session: SessionPort, layout: IncrementalLayout, assignor: Assignor, timeout: float
    ) -> None:
        name = f"consensus-steward-{layout.group}"
        super().__init__(session, name, layout.root, layout.state, GroupState.decode)
        self._layout = layout
        self._assignor = assignor
        self._timeout = timeout
        self._acks: dict[str, Mirror[ValueChanged]] = {}
        self._unrevoked: dict[str, tuple[int, float]] = {}
        self._subscriptions: dict[str, frozenset[str]] = {}
        self._grace = session.settings.session_timeout
        self._gone_since: dict[str, float] = {}

    def _decide(
        self,
        leadership: Leadership,
        members: MembershipChanged,
        state: GroupState | None,
        version: int | None,
    ) -> float:
        now = time.monotonic()
        live = {
            m: resources
            for m, data in members.members.items()
            if (resources := self._subscription(data.decode(errors="replace"))) is not None
        }
        self._keep_static(live, state, now)
        self._follow_acks(set(live) | set(state.members if state else ()))
        acks = {m: ack for m, mirror in self._acks.items() if (ack := _ack(mirror)) is not None}
        for member, ack in acks.items():
            updated = self._subscription(ack.subscription) if ack.subscription else None
            if member in live and updated is not None:
                live[member] = updated
        expired = [
            m for m, (_, since) in self._unrevoked.items() if now - self._counted_from(since) > self._timeout
        ]
        if expired and not self._store_answers_promptly():
            expired = []  # the store was stalled or cut off: their deadlines count again from now
        for member in expired:  # an acknowledgement stored just before the deadline counts
            stored = self._storage.fetch(self._layout.ack(member))
            if (ack := Ack.decode(stored.value) if stored is not None else None) is not None:
                acks[member] = ack
        current = state if state is not None else GroupState()
        new = reconcile(current, live, acks, expired, self._assignor)
        if state is None or new != state:
            self._write(leadership, new, version)
            self._forget_departed(current, new)
        now = time.monotonic()  # a revocation's deadline starts once it is asked for
        timers: dict[str, tuple[int, float]] = {}
        for member, entry in new.members.items():
            if entry.state == UNREVOKED:
                timer = self._unrevoked.get(member)
                timers[member] = timer if timer is not None and timer[0] == entry.seq else (entry.seq, now)
        self._unrevoked = timers
        deadlines = [self._counted_from(since) + self._timeout - now for _, since in self._unrevoked.values()]
        deadlines += [since + self._grace - now for since in self._gone_since.values()]
        return max(0.01, min([IDLE, *deadlines]))

    def _keep_static(self, live: dict[str, frozenset[str]], state: GroupState | None, now: float) -> None:
        """Add to ``live`` the gone static members still within the grace period."""
        gone = [m for m in (state.members if state else ()) if is_static(m) and m not in live]
        self._gone_since = {m: self._gone_since.get(m, now) for m in gone}
        for member in gone:
            assert state is not None
            resources = self._subscription(state.subscriptions.get(member, ""))
            if now - self._gone_since[member] < self._grace and resources is not None:
                live[member] = resources

    def _subscription(self, fingerprint: str) -> frozenset[str] | None:
        """The subscription stored under ``fingerprint`` (read once per digest); None if unreadable."""
        if fingerprint not in self._subscriptions:
            stored = self._storage.fetch(self._layout.subscription(fingerprint))
            try:
                resources = frozenset(str(r) for r in json.loads(stored.value)) if stored else None
            except (ValueError, TypeError):
                resources = None
            if resources is None or digest(resources) != fingerprint:
                return None
            self._subscriptions[fingerprint] = resources
        return self._subscriptions[fingerprint]

    def _forget_departed(self, old: GroupState, new: GroupState) -> None:
        for member in set(old.members) - set(new.members):
            try:
                self._storage.delete(self._layout.ack(member))
            except KeyNotFoundError:
                pass
            except ConsensusError as exc:
                log.debug("could not delete the acknowledgement of %s (%s)", member, exc)

    def _follow_acks(self, members: set[str]) -> None:
        for member in set(self._acks) - members:
            self._acks.pop(member).stop()
        for member in members - set(self._acks):
            mirror = value_mirror(self._session, self._layout.ack(member), self._thread.wake)
            mirror.start()
            self._acks[member] = mirror

    def _release(self) -> None:
        for mirror in self._acks.values():
            mirror.stop()
        self._acks = {}
        self._unrevoked = {}


def static_member_id(instance: str) -> str:
    """The member id of the static member ``instance`` (dynamic ids start with ``m-``)."""
    return f"i-{instance}"


def is_static(member: str) -> bool:
    return member.startswith("i-")


def _ack(mirror: Mirror[ValueChanged]) -> Ack | None:
    event = mirror.event
    return None if event is None else Ack.decode(event.value)
