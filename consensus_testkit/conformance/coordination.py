"""Helpers of the coordinator section: recording handlers, an ownership ledger, a child member.

``RecordingHandler`` records every callback with its thread and checks the
callback order a member must see. ``Ledger`` records, in one total order, when
each in-process member starts and stops owning each resource, so a test can
prove that no resource was ever owned by two members at once.
``CoordinatorChild`` runs one coordinator member in a child process
(``python -m consensus_testkit.conformance.coordination``) that a test can SIGKILL.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from consensus_api import (
    ConsensusError,
    Coordinator,
    IncrementalCoordinator,
    ResourceHandler,
    connect,
)
from consensus_testkit.conformance.child import ChildProcess, child_options, child_start
from consensus_testkit.conformance.helpers import EventLog


@dataclass(frozen=True, slots=True)
class Call:
    """One handler callback: its name, arguments and the thread it ran on."""

    name: str
    args: tuple[object, ...]
    thread: str


class RecordingHandler:
    """A CoordinatorHandler that records its callbacks; the leader assigns ``b"<protocol>:<member>"``."""

    def __init__(self, protocols: Sequence[tuple[str, bytes]] = (("p1", b"m"),)) -> None:
        self.protocols = list(protocols)
        self.calls: EventLog[Call] = EventLog("coordinator callbacks")
        self._hold = 0.0

    def hold_next_prepare(self, seconds: float) -> None:
        """Make the next ``on_join_prepare`` take ``seconds`` (a member too slow to rejoin)."""
        self._hold = seconds

    def _record(self, name: str, *args: object) -> None:
        self.calls(Call(name, args, threading.current_thread().name))

    def metadata(self) -> list[tuple[str, bytes]]:
        return list(self.protocols)

    def on_join_prepare(self, generation: int, member_id: str) -> None:
        self._record("prepare", generation, member_id)
        hold, self._hold = self._hold, 0.0
        if hold:
            time.sleep(hold)

    def perform_assignment(
        self, leader_id: str, protocol: str, members: Mapping[str, bytes]
    ) -> dict[str, bytes]:
        self._record("assign", leader_id, protocol, dict(members))
        return {member: f"{protocol}:{member}".encode() for member in members}

    def on_join_complete(self, generation: int, member_id: str, protocol: str, assignment: bytes) -> None:
        self._record("complete", generation, member_id, protocol, assignment)

    def on_leave_prepare(self) -> None:
        self._record("leave")

    def named(self, name: str, since: int = 0) -> list[Call]:
        """The calls named ``name`` from index ``since`` on."""
        return [call for call in self.calls.events[since:] if call.name == name]

    def check_order(self) -> None:
        """Every complete follows a prepare, generations increase: never two assignments at once
        (a complete repeated with the same arguments is the retry of one that raised)."""
        prepared, last, retried = False, -1, None
        for call in self.calls.events:
            if call.name == "prepare":
                prepared, retried = True, None
            elif call.name == "complete" and call.args != retried:
                generation = int(str(call.args[0]))
                assert prepared, f"on_join_complete without on_join_prepare before it: {self.calls.events}"
                assert generation > last, f"generation {generation} after {last}: {self.calls.events}"
                prepared, last, retried = False, generation, call.args


class Ledger:
    """When each member started and stopped owning each resource, in one total order."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.events: list[tuple[str, str, frozenset[str]]] = []
        self.owned: dict[str, set[str]] = {}

    def listener(self, member: str) -> _LedgerListener:
        """A ResourceListener recording for ``member``."""
        with self._lock:
            self.owned.setdefault(member, set())
        return _LedgerListener(self, member)

    def record(self, member: str, kind: str, resources: frozenset[str]) -> None:
        with self._lock:
            self.events.append((member, kind, resources))
            if kind == "+":
                self.owned[member] |= resources
            else:
                self.owned[member] -= resources

    def snapshot(self) -> dict[str, frozenset[str]]:
        """member -> what it owns now."""
        with self._lock:
            return {member: frozenset(resources) for member, resources in self.owned.items()}

    def mark(self) -> int:
        """A position in the event list (for ``callbacks``)."""
        with self._lock:
            return len(self.events)

    def callbacks(self, member: str, since: int) -> list[tuple[str, frozenset[str]]]:
        """``member``'s callbacks after ``since``."""
        with self._lock:
            return [(kind, r) for m, kind, r in self.events[since:] if m == member]

    def double_owned(self) -> list[str]:
        """Every moment a member started a resource another member still owned."""
        holder: dict[str, str] = {}
        problems: list[str] = []
        with self._lock:
            events = list(self.events)
        for index, (member, kind, resources) in enumerate(events):
            for resource in resources:
                if kind == "-":
                    if holder.get(resource) == member:
                        del holder[resource]
                    continue
                other = holder.get(resource)
                if other is not None and other != member:
                    problems.append(f"event {index}: {member} started {resource} still owned by {other}")
                holder[resource] = member
        return problems

    def balanced(self, members: Sequence[str], resources: frozenset[str]) -> bool:
        """Every resource owned by exactly one of ``members``, counts differing by at most one."""
        snapshot = self.snapshot()
        held = [snapshot.get(m, frozenset()) for m in members]
        total = sum(len(h) for h in held)
        union = frozenset().union(*held) if held else frozenset()
        return (
            total == len(resources) and union == resources and max(map(len, held)) - min(map(len, held)) <= 1
        )


@dataclass(frozen=True)
class _LedgerListener:
    ledger: Ledger
    member: str

    def on_assigned(self, resources: frozenset[str]) -> None:
        self.ledger.record(self.member, "+", resources)

    def on_revoked(self, resources: frozenset[str]) -> None:
        self.ledger.record(self.member, "-", resources)


class CoordinatorChild(ChildProcess):
    """A coordinator member in a child process; prints ``COMPLETE <generation> <member id>`` lines.

    With the option ``resources=N`` it is a :class:`ResourceHandler` member over ``r0..r<N-1>``
    that also prints ``ASSIGNED``/``REVOKED <r,...>``, ``PREPARE <generation>`` and, as the
    leader, ``ASSIGNING <generation>`` before assigning; ``hold_assign=S`` makes every assignment
    after its first take ``S`` seconds (a leader stuck mid-rebalance). With ``incremental=1`` as
    well it is an incremental member instead, printing ``RECONCILED`` once it first is."""

    def __init__(self, url: str, group: str, options: Mapping[str, object], lifetime: float = 120.0) -> None:
        module = "consensus_testkit.conformance.coordination"
        super().__init__(module, [group], url, options, lifetime, name="coordinator child")


def main(argv: Sequence[str] | None = None) -> int:
    """The child: join GROUP, report completes, live until stdin closes or the lifetime ends.

    Its wait for the first join or reconcile is bounded by the lifetime, not by the member's
    default (``rebalance_timeout`` + ``request_timeout``): tests SIGSTOP the child, and a deadline
    that passes during the pause would end a child whose member was about to join or reconcile
    (it revoked everything on its way out, then the test waited for it in vain). The test bounds
    how long joining may take; the child only reports."""
    parser = child_options(
        argparse.ArgumentParser(prog="python -m consensus_testkit.conformance.coordination")
    )
    parser.add_argument("group")
    args = parser.parse_args(argv)
    parent, options = child_start(args, grace=5)
    rebalance = float(options.pop("rebalance_timeout", 10))
    resources = int(options.pop("resources", 0))
    hold = float(options.pop("hold_assign", 0))
    incremental = options.pop("incremental", "") == "1"

    class Reporting(RecordingHandler):
        def on_join_complete(self, generation: int, member_id: str, protocol: str, assignment: bytes) -> None:
            print("COMPLETE", generation, member_id, flush=True)

    try:
        with connect(os.environ["CONSENSUS_URL"], **options) as session:
            member: Coordinator | IncrementalCoordinator
            names = [f"r{index}" for index in range(resources)]
            if incremental:
                member = session.incremental_coordinator(
                    args.group, names, _PrintingListener(), rebalance_timeout=rebalance
                )
                member.ensure_active_group(args.lifetime)
                print("RECONCILED", flush=True)
            elif resources:
                handler = _ReportingResources(names, _PrintingListener(), hold)
                member = handler.join(session, args.group, rebalance_timeout=rebalance)
                member.ensure_active_group(args.lifetime)
            else:
                member = session.coordinator(args.group, "test", Reporting(), rebalance_timeout=rebalance)
                member.ensure_active_group(args.lifetime)
            parent.stop.wait(args.lifetime)  # until stdin closes
    except ConsensusError as exc:
        print("ERROR", type(exc).__name__, exc, flush=True)
        return 1
    return 0


class _PrintingListener:
    def on_assigned(self, resources: frozenset[str]) -> None:
        print("ASSIGNED", ",".join(sorted(resources)), flush=True)

    def on_revoked(self, resources: frozenset[str]) -> None:
        print("REVOKED", ",".join(sorted(resources)), flush=True)


class _ReportingResources(ResourceHandler):
    """A ResourceHandler reporting its joins; assignments after the first take ``hold`` seconds."""

    def __init__(self, resources: Sequence[str], listener: _PrintingListener, hold: float) -> None:
        super().__init__(resources, listener, assignors=["cooperative-sticky"])
        self._hold = hold
        self._assigned = 0

    def on_join_prepare(self, generation: int, member_id: str) -> None:
        print("PREPARE", generation, flush=True)
        super().on_join_prepare(generation, member_id)

    def perform_assignment(
        self, leader_id: str, protocol: str, members: Mapping[str, bytes]
    ) -> dict[str, bytes]:
        print("ASSIGNING", len(members), flush=True)
        self._assigned += 1
        if self._assigned > 1:
            time.sleep(self._hold)
        return super().perform_assignment(leader_id, protocol, members)

    def on_join_complete(self, generation: int, member_id: str, protocol: str, assignment: bytes) -> None:
        super().on_join_complete(generation, member_id, protocol, assignment)
        print("COMPLETE", generation, member_id, flush=True)


def owned_by(child: ChildProcess) -> frozenset[str]:
    """What a resource child owns according to its ASSIGNED/REVOKED lines."""
    owned: set[str] = set()
    for line in child.lines.events:
        kind, _, names = line.partition(" ")
        if kind in ("ASSIGNED", "REVOKED") and names:
            (owned.update if kind == "ASSIGNED" else owned.difference_update)(names.split(","))
    return frozenset(owned)


if __name__ == "__main__":
    sys.exit(main())
