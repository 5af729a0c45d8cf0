"""How a session reads a group's members: DescribeGroups, the last Stable roster, departures.

A membership group's members are the entries naming it in the prefix's one
membership group (:mod:`consensus_backends.kafka.protocol`); a candidate is
the one entry of its Kafka member. While the Kafka group is Stable every
Kafka member's metadata (its entries: group, id, data) and its own
assignment (the entries the group leader rejected) are
visible; during a rebalance only the Kafka member ids are, so the last Stable
roster is used for members still present, and a reader waits (at most
``session_timeout`` plus a second) when a Kafka member it has never seen is
joining. Entries and Kafka members recorded as departed in the command log are
never reported (:mod:`consensus_backends.kafka.departures`).

The roster a session reads never goes back: a Stable description of an earlier
generation than the last roster read (the group leader writes the generation
into every assignment) is read as that last roster. A coordinator cut off from
the other brokers answers DescribeGroups from memory; the broker that takes a
group over (a move, a restart) describes it from its committed state, which
can end generations before the last one described; and a description may be
read after a later one was, on another thread. Each would hide the members
that joined since, and show them again at the next generation.

The re-reads that follow a reported change share one description: each may
answer from the latest description whose request went out after the last
change reported in its Kafka group (:meth:`Rosters.reported`), so a burst of
reports (a departure reports every watched group) costs one DescribeGroups.
"""

from __future__ import annotations

import logging
import threading
import time

import kafka.errors as kerrors

from consensus_api.errors import ConsensusError
from consensus_backends.kafka.client import GONE, STABLE, Channel, GroupView
from consensus_backends.kafka.errors import timeout_error, translate
from consensus_backends.kafka.protocol import Metadata, Roster, decode_metadata
from consensus_backends.kafka.settings import Settings
from consensus_backends.kafka.state import StateMachine

log = logging.getLogger("consensus_api.kafka")

SETTLE_POLL = 0.05


class Rosters:
    """Reads groups for one session and remembers each group's last Stable roster. Thread-safe."""

    def __init__(self, settings: Settings, channel: Channel, state: StateMachine) -> None:
        self._settings = settings
        self._channel = channel
        self._state = state
        self._lock = threading.Lock()
        #: Group id -> the last Stable view read, and its roster.
        self._read: dict[str, tuple[GroupView, Roster]] = {}
        self._decoded: dict[str, dict[bytes, Metadata | None]] = {}  # group id -> its members' metadata
        #: Group id -> when its latest description was requested, and that description.
        self._latest: dict[str, tuple[float, GroupView]] = {}
        #: Group id -> when a change of a target read from it was last reported.
        self._reported: dict[str, float] = {}

    def reported(self, group_id: str) -> None:
        """A change of a target read from ``group_id`` is about to be reported (call it first)."""
        with self._lock:
            self._reported[group_id] = time.monotonic()

    def describe(self, group_id: str, deadline: float, *, since_report: bool = False) -> GroupView:
        """One DescribeGroups answer for ``group_id``; Kafka errors as consensus_api errors. With
        ``since_report``, the latest answer instead if it was requested after the last report."""
        with self._lock:
            latest = self._latest.get(group_id)
            reported = self._reported.get(group_id)
        if since_report and latest is not None and reported is not None and latest[0] >= reported:
            return latest[1]
        requested = time.monotonic()
        try:
            view = self._channel.describe([group_id], deadline)[group_id]
        except kerrors.KafkaError as exc:
            raise translate(exc, f"describing group {group_id!r}") from None
        with self._lock:
            latest = self._latest.get(group_id)
            if group_id in self._reported and (latest is None or latest[0] < requested):
                self._latest[group_id] = (requested, view)  # kept only where re-reads may share it
        return view

    def entries(
        self,
        group_id: str,
        name: str,
        deadline: float,
        *,
        settle: bool = True,
        since_report: bool = False,
    ) -> list[tuple[str, bytes]]:
        """(id, data) of the accepted members of ``name`` (a group, or a service) in the Kafka group
        ``group_id``. While Kafka members never seen in a Stable roster are joining,
        wait (at most ``session_timeout`` plus a second) for the rebalance to end if ``settle``, else
        answer at once from the last Stable roster this session saw. Departed members are left out.
        ``since_report``: a re-read after a reported change (see :meth:`describe`)."""
        settle_within = (
            min(self._settings.request_timeout, self._settings.session_timeout + 1) if settle else 0.0
        )
        settle_by = time.monotonic() + settle_within
        while True:
            view = self.describe(group_id, deadline, since_report=since_report)
            since_report = False  # waiting for the rebalance to end: describe again
            if view.state in GONE:
                return []
            roster, present, departed = self._against(group_id, view)
            give_up = time.monotonic() + SETTLE_POLL >= settle_by
            if roster is not None and (present <= roster.known or give_up):  # a Stable view knows all
                found = roster.present(name, present, departed)
                if log.isEnabledFor(logging.DEBUG):
                    log.debug("%s in %s (%s): %s", name, group_id, view.state, sorted(found))
                return list(found.items())
            if give_up:
                if not settle:
                    return []
                raise timeout_error(f"the rebalance of group {group_id!r} to end")
            time.sleep(SETTLE_POLL)

    def fingerprint(self, group_id: str, name: str, view: GroupView) -> object:
        """What a read of ``name``'s members from ``view`` would report, as ``<Kafka member
        id>#<token>`` of each entry; it changes exactly when that answer may (``view`` is Stable
        and remembered as the last roster, or read against the last one: see :meth:`_against`)."""
        if view.state in GONE:
            return frozenset()
        try:
            roster, present, departed = self._against(group_id, view)
        except ConsensusError:
            return view.protocol_type  # not ours: a read raises
        if roster is None:
            return view.state
        return roster.tokens(name, present, departed)

    def _against(self, group_id: str, view: GroupView) -> tuple[Roster | None, set[str], frozenset[str]]:
        """The roster ``view`` is read against, the Kafka members present in it and those recorded
        as departed. A Stable view is read against its own roster, unless that is older than the
        last one read (:meth:`_stable`): then, as if the view said nothing, against the last roster
        and its members. A rebalancing view's members are read against the last Stable roster, if
        any."""
        departed = self._state.departed(group_id)
        if view.state == STABLE:
            roster, own = self._stable(group_id, view)
            return roster, set(view.members if own else roster.known) - departed, departed
        with self._lock:
            read = self._read.get(group_id)
        return (None if read is None else read[1]), set(view.members) - departed, departed

    def _stable(self, group_id: str, view: GroupView) -> tuple[Roster, bool]:
        """The roster of the Stable ``view``, remembered as the group's last, and True; or the last
        roster and False if the view's is older (:meth:`Roster.older_than`; see the module
        docstring): the roster a session reads never goes back. A member's metadata is decoded only
        when it changed since the last view read (a big group's metadata changes one member at a
        time, and a view is read for each group watched in it)."""
        with self._lock:
            read = self._read.get(group_id)
            previous = self._decoded.get(group_id, {})
        if read is not None and read[0] is view:
            return read[1], True
        current: dict[bytes, Metadata | None] = {}

        def decode(raw: bytes) -> Metadata | None:
            metadata = previous[raw] if raw in previous else decode_metadata(raw)
            current[raw] = metadata
            return metadata

        roster = Roster.of(group_id, view, decode)
        with self._lock:
            last = self._read.get(group_id)
            newer = last[1] if last is not None and roster.older_than(last[1]) else None
            if newer is None:
                self._read[group_id] = (view, roster)
                self._decoded[group_id] = current
        if newer is not None:
            log.debug(
                "%s: a Stable description of generation %d, older than the last read (%d), is not used",
                group_id,
                roster.generation,
                newer.generation,
            )
            return newer, False
        if log.isEnabledFor(logging.DEBUG):
            entries = {
                name: [f"{e.id}@{kid}#{e.token}" for kid, e in found] for name, found in roster.groups.items()
            }
            log.debug("%s: the last Stable roster, generation %d: %s", group_id, roster.generation, entries)
        return roster, True
