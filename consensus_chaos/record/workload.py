"""The random workload one chaos client runs, recording every operation and listener event.

Guarantees: the client is sequential (one operation at a time); every written
value and every member or candidate id is unique in the run; after an
operation whose outcome is unknown (``info``) the client backs off for
``BACKOFF`` seconds and continues under a new incarnation, i.e. a new
history process (indeterminate writes stay open forever, and each one open
on a key doubles what the checker may have to search). Keys rotate: the key of a slot
changes every ``key_period``; at most 8 clients (a team) share a slot.
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from consensus_api.errors import (
    FencedError,
    KeyExistsError,
    KeyNotFoundError,
    MemberExistsError,
    NotAMemberError,
    VersionConflictError,
)
from consensus_api.model import LeaderChanged, Leadership, MembershipChanged, SessionState, ValueChanged
from consensus_api.session import Session
from consensus_chaos.record.journal import Journal
from consensus_chaos.record.schema import (
    ELECTION,
    EVENT,
    FAIL,
    GROUP,
    INFO,
    INVOKE,
    KV,
    LEADER_EVENT,
    OK,
    READS,
    SESSION,
    STATE_EVENT,
    UNWATCH,
    VALUE_EVENT,
    VIEW_EVENT,
    WATCH,
)

TEAM_SIZE = 8
BACKOFF = (0.2, 1.0)  # seconds to wait after an operation failed for an unknown reason
QUIET = 0.5  # seconds without listener events before the final reads
SETTLE_MAX = 5.0  # at most this long
#: Errors that tell what the operation found: a definite outcome without effect.
DEFINITE = (
    KeyExistsError,
    KeyNotFoundError,
    VersionConflictError,
    FencedError,
    MemberExistsError,
    NotAMemberError,
)

Fields = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Plan:
    """Where client ``client`` of ``clients`` works: its team's key slots, group and service."""

    prefix: str
    clients: int
    keys: int
    key_period_ns: int
    t0_ns: int
    client: int

    @property
    def teams(self) -> int:
        return math.ceil(self.clients / TEAM_SIZE)

    @property
    def team(self) -> int:
        return self.client // TEAM_SIZE

    def slots(self) -> list[int]:
        """The key slots of this client's team (never empty when ``keys >= teams``)."""
        return [slot for slot in range(self.keys) if slot % self.teams == self.team]

    def epoch(self) -> int:
        return max(0, (time.monotonic_ns() - self.t0_ns) // self.key_period_ns)

    def key(self, slot: int, epoch: int) -> str:
        return f"{self.prefix}/k{slot}e{epoch}"

    @property
    def group(self) -> str:
        return f"{self.prefix}/g{self.team}"

    @property
    def service(self) -> str:
        return f"{self.prefix}/s{self.team}"


def text(value: bytes | None) -> str | None:
    """Stored bytes as history text (values written by the workload are ASCII)."""
    return None if value is None else value.decode("utf-8", "backslashreplace")


class Worker:
    """One client process's workload over one session."""

    def __init__(self, session: Session, journal: Journal, plan: Plan, rng: random.Random) -> None:
        self.session = session
        self.journal = journal
        self.plan = plan
        self.rng = rng
        self.incarnation = 0
        self.seq = 0
        self.versions: dict[str, int] = {}
        self.candidate: str | None = None
        self.leadership: Leadership | None = None
        self.members: list[str] = []
        self.watched: set[str] = set()
        self.lost = threading.Event()  # set on the dispatcher thread, handled by the workload's
        self.epoch = -1
        self.last_event_ns = time.monotonic_ns()
        self.election = session.election(plan.service)
        self.group = session.group(plan.group)

    # Listeners: events are recorded under the observer's first process (incarnation 0).

    def start_listening(self) -> None:
        """Record session states, the team's election and group, and the current keys."""
        self.session.add_state_listener(self._on_state)
        self.event(ELECTION, WATCH, service=self.plan.service)
        self.election.add_listener(self._on_leader)
        self.event(GROUP, WATCH, key=self.plan.group)
        self.group.add_listener(self._on_view)
        self.rotate()

    def event(self, kind: str, f: str, **fields: Any) -> None:
        self.last_event_ns = time.monotonic_ns()
        self.journal.write({"kind": kind, "type": EVENT, "f": f, "inc": 0, **fields})

    def _on_state(self, state: SessionState) -> None:
        if state is SessionState.LOST:
            self.lost.set()
        self.event(SESSION, STATE_EVENT, value=state.value)

    def _on_leader(self, change: LeaderChanged) -> None:
        self.event(ELECTION, LEADER_EVENT, service=change.service, leader=change.leader_id, term=change.term)

    def _on_view(self, change: MembershipChanged) -> None:
        self.event(GROUP, VIEW_EVENT, key=change.group, members=sorted(change.members))

    def _on_value(self, change: ValueChanged) -> None:
        self.event(KV, VALUE_EVENT, key=change.key, value=text(change.value), version=change.version)

    def rotate(self) -> None:
        """Move the value listeners to the keys of the current epoch."""
        epoch = self.plan.epoch()
        if epoch == self.epoch:
            return
        self.epoch = epoch
        current = {self.plan.key(slot, epoch) for slot in self.plan.slots()}
        for key in sorted(self.watched - current):
            self.session.listeners.remove_value_listener(key, self._on_value)
            self.watched.discard(key)
            self.event(KV, UNWATCH, key=key)
        for key in sorted(current - self.watched):
            self.event(KV, WATCH, key=key)
            self.watched.add(key)
            self.session.listeners.add_value_listener(key, self._on_value)

    # Operations.

    def call(
        self, kind: str, f: str, fields: Fields, run: Callable[[], Any], out: Callable[[Any], Fields]
    ) -> tuple[bool, Any]:
        """Record ``run()`` as one operation: ``(True, result)``, or ``(False, None)`` unless it succeeded."""
        self.seq += 1
        base = {"kind": kind, "f": f, "seq": self.seq, "inc": self.incarnation, **fields}
        self.journal.write({**base, "type": INVOKE})
        try:
            result = run()
        except DEFINITE as exc:
            self.journal.write({**base, "type": FAIL, "error": type(exc).__name__})
            return False, None
        except Exception as exc:
            reads = f in READS
            self.journal.write({**base, "type": FAIL if reads else INFO, "error": type(exc).__name__})
            if not reads:
                self.incarnation += 1  # the op stays outstanding forever: continue as a new process
            time.sleep(
                self.rng.uniform(*BACKOFF)
            )  # like a real client; each open write multiplies the search
            return False, None
        self.journal.write({**base, "type": OK, **out(result)})
        return True, result

    def value(self) -> str:
        return f"v{self.journal.spawn}.{self.seq + 1}"

    def fetch(self, key: str) -> tuple[bool, Any]:
        def out(found: Any) -> Fields:
            if found is None:
                return {}
            self.versions[key] = found.version
            return {"value": text(found.value), "version": found.version}

        return self.call(KV, "fetch", {"key": key}, lambda: self.session.storage.fetch(key), out)

    def write(self, f: str, key: str, versioned: bool, fence: Leadership | None = None) -> None:
        """``put``, ``update`` or ``delete`` KEY, with the last version this client saw if ``versioned``."""
        storage, value = self.session.storage, self.value()
        expected = self.versions.get(key) if versioned and f != "put" else None
        fields: Fields = {"key": key, "expected_version": expected}
        if f != "delete":
            fields["value"] = value
        if fence is not None:
            fields.update(service=fence.service, term=fence.term)
        calls: dict[str, Callable[[], Any]] = {
            "put": lambda: storage.put(key, value.encode(), fence=fence),
            "update": lambda: storage.update(key, value.encode(), version=expected, fence=fence),
            "delete": lambda: storage.delete(key, version=expected, fence=fence),
        }

        def out(version: int | None) -> Fields:
            if version is None:
                self.versions.pop(key, None)
                return {}
            self.versions[key] = version
            return {"version": version}

        done, _ = self.call(KV, f, fields, calls[f], out)
        if not done and fence is not None:
            self.leadership = None  # fenced or unknown: ask again before the next fenced write

    def nominate(self) -> None:
        if self.candidate is not None:
            self.read_leadership()
            return
        candidate = f"c{self.journal.spawn}.{self.seq + 1}"
        done, _ = self.call(
            ELECTION,
            "nominate",
            {"service": self.plan.service, "value": candidate},
            lambda: self.election.nominate(candidate),
            lambda lead: {"leader": candidate if lead else None},
        )
        if done:
            self.candidate = candidate
            self.read_leadership()

    def resign(self) -> None:
        candidate = self.candidate
        if candidate is None:
            return
        self.candidate, self.leadership = None, None
        self.call(
            ELECTION,
            "resign",
            {"service": self.plan.service, "value": candidate},
            lambda: self.election.resign(candidate),
            lambda _: {},
        )

    def read_leadership(self) -> tuple[bool, Leadership | None]:
        """Read the team's leadership; keep it as this client's fence when this client leads."""

        def out(current: Leadership | None) -> Fields:
            if current is None:
                return {}
            return {"leader": current.leader_id, "term": current.term}

        done, current = self.call(
            ELECTION, "leadership", {"service": self.plan.service}, self.election.leadership, out
        )
        if current is not None and current.leader_id == self.candidate:
            self.leadership = current
        return done, current

    def join(self) -> None:
        member = f"m{self.journal.spawn}.{self.seq + 1}"
        fields = {"key": self.plan.group, "value": member}
        done, _ = self.call(GROUP, "join", fields, lambda: self.group.join(member), lambda _: {})
        if done:
            self.members.append(member)

    def leave(self) -> None:
        if self.members:
            member = self.members.pop(self.rng.randrange(len(self.members)))
            self.call(
                GROUP,
                "leave",
                {"key": self.plan.group, "value": member},
                lambda: self.group.leave(member),
                lambda _: {},
            )

    def read_members(self) -> tuple[bool, Any]:
        return self.call(
            GROUP,
            "members",
            {"key": self.plan.group},
            self.group.members,
            lambda found: {"members": sorted(found)},
        )

    def step(self) -> None:
        """One random operation on the team's current keys, election or group."""
        if self.lost.is_set():  # auto_rejoin is off: the memberships and the candidacy are void
            self.lost.clear()
            self.members.clear()
            self.candidate, self.leadership = None, None
        self.rotate()
        key = self.rng.choice(sorted(self.watched))
        roll = self.rng.random()
        if roll < 0.30:
            self.fetch(key)
        elif roll < 0.42:
            self.write("put", key, versioned=False)
        elif roll < 0.62:
            self.write("update", key, versioned=self.rng.random() < 0.5)
        elif roll < 0.70:
            self.write("delete", key, versioned=self.rng.random() < 0.5)
        elif roll < 0.80:
            if self.leadership is not None:
                f = self.rng.choice(("put", "update", "update", "delete"))
                self.write(f, key, versioned=False, fence=self.leadership)
            else:
                self.nominate()
        elif roll < 0.84:
            self.resign()
        elif roll < 0.86:
            self.read_leadership()
        elif roll < 0.93:
            if len(self.members) < 2:
                self.join()
        else:
            self.leave()
