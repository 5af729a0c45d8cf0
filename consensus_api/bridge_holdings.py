"""What a bridged session holds on the store it uses, and its parking during a cut-over
(``consensus_api.bridging``): the candidacies it took there (whether one leads decides when it
queues up again on the arriving store) and whether it is parked now."""

from __future__ import annotations

import logging

from consensus_api.errors import ConsensusError, SessionLostError
from consensus_api.floor import FloorBackend

log = logging.getLogger("consensus_api.migrate")


class Holdings:
    """One bridged session's candidacies on the store with authority; while ``parked`` it takes no
    member or candidacy and reads no leadership (``SessionLostError``)."""

    def __init__(self) -> None:
        self.candidacies: set[tuple[str, str]] = set()
        self.parked = False
        #: Whether, when it parked, none of this session's candidates led (they queue up later).
        self.queued_behind_when_parked = False

    def queued_behind(self, side: FloorBackend) -> bool:
        """Whether this session has candidates on ``side`` and none of them leads there."""
        if self.parked:
            return self.queued_behind_when_parked
        try:
            return bool(self.candidacies) and not any(
                (found := side.leadership(service)) is not None and found.leader_id == candidate
                for service, candidate in list(self.candidacies)
            )
        except ConsensusError:
            return False

    def park(self, side: FloorBackend) -> None:
        """Park: remember whether this session's candidates queue behind others on ``side`` (every
        bridged session parks before any moves, so the queue is still whole), then take nothing."""
        self.queued_behind_when_parked = self.queued_behind(side)
        self.parked = True

    def store(self, side: FloorBackend) -> FloorBackend:
        """``side``, to take a member or candidacy on, or to read a leadership from (a term read
        while parked could exceed the new store's floor); ``SessionLostError`` while parked."""
        if self.parked:
            raise SessionLostError("the bridged session is parked while a migration's cut-over runs")
        return side

    def nominate(self, side: FloorBackend, service: str, candidate_id: str) -> bool:
        leads = self.store(side).nominate(service, candidate_id)
        self.candidacies.add((service, candidate_id))
        return leads

    def resign(self, side: FloorBackend, service: str, candidate_id: str) -> None:
        self.candidacies.discard((service, candidate_id))
        self.store(side).resign(service, candidate_id)
