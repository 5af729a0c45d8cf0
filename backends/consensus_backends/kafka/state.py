"""The state machine every session rebuilds from the command log.

Commands are applied strictly in log order, so every session reaches the same
decision for every command, including which of two racing conditional writes
won. A version or a term is the command's offset plus one: strictly
increasing for a key across updates, delete and re-create, and across leaders.

Leases (who leads a service, under which term) live in the same log. A
``LEAD`` claim succeeds only if it names the term it replaces (a compare and
set on the service's lease), an ``UNLEAD`` vacates the lease it names, and a
fenced write succeeds only if its ``(leader, term)`` is the lease in force at
that point of the log: fencing is decided in log order, atomically with the
write.

The seal (``SEAL``, undone by ``UNSEAL``) is a command in the same log: a
storage write applied after it is refused (``SEALED``) by every session alike,
checked in log order, so atomically with the write; members, candidates and
leases are not affected, and a log without one was never sealed.

Departures (``DEPART``) record Kafka group members that left for good; a
member id once departed stays departed (:mod:`consensus_backends.kafka.groups`).
Applying one names the Kafka groups it touched, so that every group and
election read from them is read again: a read that saw a member just before
its departure was applied is then followed by one that does not.
"""

from __future__ import annotations

import enum
import threading
from collections import defaultdict
from dataclasses import dataclass
from typing import NamedTuple

from consensus_api.backend import Target, TargetKind
from consensus_api.keys import parent_of
from consensus_api.model import Leadership, Versioned
from consensus_backends.kafka.records import Command, Op, decode_departures


@dataclass(frozen=True, slots=True)
class Lease:
    """A service's lease: ``leader`` is None once vacated; ``member`` is the leader's Kafka member id."""

    term: int
    leader: str | None = None
    member: str | None = None


VACANT = Lease(0)


class Result(enum.Enum):
    """How a command ended."""

    OK = "ok"
    EXISTS = "exists"
    NOT_FOUND = "not found"
    CONFLICT = "conflict"
    FENCED = "fenced"
    REJECTED = "rejected"
    SEALED = "sealed"


@dataclass(frozen=True, slots=True)
class Outcome:
    """A command's result; ``number`` is the new version or term when ``result`` is OK."""

    result: Result
    number: int = 0


class Applied(NamedTuple):
    """What applying one command did: its outcome, the targets whose state it changed, and the
    Kafka groups in which it recorded departures."""

    outcome: Outcome
    targets: list[Target]
    departed_in: frozenset[str] = frozenset()


class StateMachine:
    """Values, the key tree and the leases, as of the commands applied so far. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[str, Versioned] = {}
        self._children: defaultdict[str, set[str]] = defaultdict(set)
        self._leases: dict[str, Lease] = {}
        self._departed: defaultdict[str, set[str]] = defaultdict(set)
        self._sealed = False

    def get(self, key: str) -> Versioned | None:
        """The key's value and version, or None."""
        with self._lock:
            return self._values.get(key)

    def children(self, namespace: str) -> frozenset[str]:
        """The existing keys exactly one level below ``namespace``."""
        with self._lock:
            return frozenset(self._children.get(namespace, ()))

    def below(self, namespace: str) -> list[tuple[str, Versioned]]:
        """Every key at any depth below ``namespace`` with its value, in key order (one snapshot)."""
        prefix = f"{namespace}/" if namespace else ""
        with self._lock:
            found = [(key, value) for key, value in self._values.items() if key.startswith(prefix)]
        return sorted(found, key=lambda item: item[0])

    def lease(self, service: str) -> Lease:
        """The service's lease (``VACANT`` if it never had one)."""
        with self._lock:
            return self._leases.get(service, VACANT)

    def departed(self, group_id: str) -> frozenset[str]:
        """The Kafka member ids of ``group_id`` recorded as gone for good."""
        with self._lock:
            return frozenset(self._departed.get(group_id, ()))

    def sealed(self) -> bool:
        """Whether the last ``SEAL`` or ``UNSEAL`` applied was a ``SEAL``."""
        with self._lock:
            return self._sealed

    def apply(self, offset: int, command: Command) -> Applied:
        """Apply the command at ``offset``."""
        with self._lock:
            if command.op is Op.DEPART:
                departures = decode_departures(command.value)
                for group_id, member_id in departures:
                    self._departed[group_id].add(member_id)
                return Applied(Outcome(Result.OK), [], frozenset(group_id for group_id, _ in departures))
            if command.op is Op.LEAD:
                return self._lead(offset, command)
            if command.op is Op.UNLEAD:
                return self._unlead(command)
            if command.op in (Op.SEAL, Op.UNSEAL):
                self._sealed = command.op is Op.SEAL
                return Applied(Outcome(Result.OK), [])
            if self._sealed:
                return Applied(Outcome(Result.SEALED), [])
            if command.fence is not None and not self._fence_holds(command.fence):
                return Applied(Outcome(Result.FENCED), [])
            current = self._values.get(command.name)
            if command.op is Op.PUT:
                if current is not None:
                    return Applied(Outcome(Result.EXISTS), [])
            elif current is None:
                return Applied(Outcome(Result.NOT_FOUND), [])
            elif command.version is not None and command.version != current.version:
                return Applied(Outcome(Result.CONFLICT, current.version), [])
            return self._write(offset, command, created=current is None)

    def _write(self, offset: int, command: Command, *, created: bool) -> Applied:
        key = command.name
        targets = [Target(TargetKind.VALUE, key)]
        if command.op is Op.DELETE:
            del self._values[key]
            self._children[parent_of(key)].discard(key)
            if not self._children[parent_of(key)]:
                del self._children[parent_of(key)]
            return Applied(Outcome(Result.OK), [*targets, Target(TargetKind.KEYSET, parent_of(key))])
        self._values[key] = Versioned(command.value, offset + 1)
        if created:
            self._children[parent_of(key)].add(key)
            targets.append(Target(TargetKind.KEYSET, parent_of(key)))
        return Applied(Outcome(Result.OK, offset + 1), targets)

    def _fence_holds(self, fence: Leadership) -> bool:
        lease = self._leases.get(fence.service, VACANT)
        return lease.leader == fence.leader_id and lease.term == fence.term

    def _lead(self, offset: int, command: Command) -> Applied:
        lease = self._leases.get(command.name, VACANT)
        if command.term != lease.term:
            return Applied(Outcome(Result.REJECTED, lease.term), [])
        self._leases[command.name] = Lease(offset + 1, command.candidate, command.member)
        return Applied(Outcome(Result.OK, offset + 1), [Target(TargetKind.ELECTION, command.name)])

    def _unlead(self, command: Command) -> Applied:
        lease = self._leases.get(command.name, VACANT)
        if lease.term != command.term or lease.member != command.member or lease.leader is None:
            return Applied(Outcome(Result.REJECTED, lease.term), [])
        self._leases[command.name] = Lease(lease.term)
        return Applied(Outcome(Result.OK, lease.term), [Target(TargetKind.ELECTION, command.name)])
