"""What the core re-reads a watched target with after a change was reported (``Backend.change_reader``).

Values and key sets as this session's state machine holds them, without
``sync``'s round trip: a change is reported once the log reader applied it, and
the state machine only moves forward, so the re-read sees the change and never
less than an earlier read did. Groups likewise, from a description requested
after the report (``Groups.membership``'s ``reread``); elections are read as the
backend reads them.
"""

from __future__ import annotations

from consensus_api.model import Leadership, Versioned
from consensus_backends.kafka.groups import Groups
from consensus_backends.kafka.state import StateMachine


class ChangeReader:
    """``KafkaBackend.change_reader``: keys from the state machine, groups and elections from ``Groups``."""

    def __init__(self, state: StateMachine, groups: Groups) -> None:
        self._state = state
        self._groups = groups

    def fetch(self, key: str) -> Versioned | None:
        return self._state.get(key)

    def keys(self, namespace: str) -> frozenset[str]:
        return self._state.children(namespace)

    def membership(self, group: str) -> dict[str, bytes]:
        return self._groups.membership(group, reread=True)

    def leadership(self, service: str) -> Leadership | None:
        return self._groups.leadership(service)
