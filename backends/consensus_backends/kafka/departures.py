"""Members this session gave up, recorded as departed in the command log before they leave.

The broker keeps a classic group's last completed generation in
``__consumer_offsets`` and, when it loads the group after a restart (or a move
of the coordinator), restores those members with fresh session timers. A
member removed since (LeaveGroup, expiry) whose removal no later generation
recorded comes back on the broker for up to its session timeout, although no
client holds it. So the broker's roster alone cannot say who is a member.

A Kafka member id, once it left, is never used again: the backend's member
that the broker drops is lost for good and a new join gets a new id. Before a
session sends LeaveGroup for a member it gives up (``leave``, ``resign``,
``close``, or every member when the session is LOST) it appends a ``DEPART``
record naming it, so every reader that has caught up with the log treats that
id as absent whatever the broker restores. ``leave`` returns only once the
record is acknowledged; a departure that could not be recorded stays pending
and is recorded (then LeaveGroup sent) before the session reports CONNECTED
again, or at the next tick while it stays CONNECTED.
"""

from __future__ import annotations

import logging
import threading

import kafka.errors as kerrors

from consensus_api.errors import ConsensusError
from consensus_backends.kafka.client import Channel
from consensus_backends.kafka.commandlog import CommandLog
from consensus_backends.kafka.protocol import ENTRY_SEP
from consensus_backends.kafka.records import Command, Op, encode_departures

log = logging.getLogger("consensus_api.kafka")

#: (Kafka group id, Kafka member id), or (Kafka group id, ``<Kafka member id>#<token>``) for one
#: entry of a member that stays (:mod:`consensus_backends.kafka.protocol`)
Departure = tuple[str, str]


class Departures:
    """Records departures in the log and removes the departed from their groups. Thread-safe."""

    def __init__(self, log_: CommandLog, channel: Channel) -> None:
        self._log = log_
        self._channel = channel
        self._lock = threading.Lock()
        self._unrecorded: list[Departure] = []
        self._unleft: list[Departure] = []

    def record(self, departures: list[Departure], deadline: float) -> ConsensusError | None:
        """Append one ``DEPART`` record naming ``departures``; the error if it was not acknowledged
        (those stay pending)."""
        if not departures:
            return None
        try:
            self._log.command(Command(Op.DEPART, "", value=encode_departures(departures)), deadline)
        except ConsensusError as exc:
            log.info("could not record %d departed members (%s)", len(departures), type(exc).__name__)
            with self._lock:
                self._unrecorded += [d for d in departures if d not in self._unrecorded]
            return exc
        return None

    def unleft(self, departure: Departure) -> None:
        """``departure`` is recorded but its LeaveGroup failed: retry it in ``settle``."""
        with self._lock:
            self._unleft.append(departure)

    def pending(self) -> bool:
        """True while a departure is unrecorded or its member may still be in its group."""
        with self._lock:
            return bool(self._unrecorded or self._unleft)

    def settle(self, deadline: float) -> None:
        """Record the unrecorded departures, then send LeaveGroup for every pending one (blocks)."""
        with self._lock:
            unrecorded = list(self._unrecorded)
        if unrecorded:
            if self.record(unrecorded, deadline) is not None:
                return
            with self._lock:
                self._unrecorded = [d for d in self._unrecorded if d not in unrecorded]
                self._unleft += [d for d in unrecorded if ENTRY_SEP not in d[1]]  # entries: no LeaveGroup
        with self._lock:
            unleft = list(self._unleft)
        for group_id, member_id in unleft:
            try:
                self._channel.leave(group_id, [member_id], deadline)
            except kerrors.KafkaError as exc:
                log.info("could not remove old member %s of %s (%s)", member_id, group_id, type(exc).__name__)
                continue
            with self._lock:
                self._unleft.remove((group_id, member_id))
