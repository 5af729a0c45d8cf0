"""A chaos client of the coordinator workload: ``python -m consensus_chaos.record.ownership ...``.

It takes the storage client's command line and line protocol
(:mod:`consensus_chaos.record.client_process`: ``READY``, ``SESSION``, ``STOPPED``,
``DONE``, ``BYE``) and, instead of storage operations, is one member of the
run's resource group (``ResourceHandler``, ``cooperative-sticky``) sharing
``RESOURCES`` resources. It journals, as ``coordinator`` events:
``subscribed`` (every resource, once), ``assigned`` / ``revoked`` (``key`` the
resource, ``value`` the member id, ``term`` the generation, at the moment the
listener runs) and, after ``FINAL`` once the group is quiet, ``final``
(``members``: what it owns then). ``consensus_chaos.check.ownership`` checks
them.
"""

from __future__ import annotations

import argparse
import sys
import time

from consensus_api.children import Parent
from consensus_api.coordinator import Coordinator, ResourceHandler
from consensus_api.errors import ConsensusError
from consensus_api.session import Session
from consensus_chaos.record.client_process import Workload, add_log_level, serve
from consensus_chaos.record.journal import Journal
from consensus_chaos.record.schema import COORDINATOR, EVENT, FINAL
from consensus_chaos.record.workload import SETTLE_MAX

#: How many resources the run's group shares.
RESOURCES = 8
#: Seconds the group's ownership must not change before the final record.
QUIET = 1.0


class Recorder:
    """A ResourceListener journaling every start and stop of a resource."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.coordinator: Coordinator | None = None
        self.changed = time.monotonic()

    def record(self, f: str, **fields: object) -> None:
        self.journal.write({"kind": COORDINATOR, "type": EVENT, "f": f, **fields})

    def _each(self, f: str, resources: frozenset[str]) -> None:
        coordinator = self.coordinator
        generation = coordinator.generation() if coordinator is not None else None
        for resource in sorted(resources):
            self.record(
                f,
                key=resource,
                value=generation.member_id if generation else None,
                term=generation.generation_id if generation else None,
            )
        self.changed = time.monotonic()

    def on_assigned(self, resources: frozenset[str]) -> None:
        self._each("assigned", resources)

    def on_revoked(self, resources: frozenset[str]) -> None:
        self._each("revoked", resources)


def record_final(handler: ResourceHandler, coordinator: Coordinator, recorder: Recorder) -> None:
    """Once the member is stable and its ownership has not changed for ``QUIET`` s (at most
    ``SETTLE_MAX`` s), record what it owns."""
    limit = time.monotonic() + SETTLE_MAX
    while time.monotonic() < limit and (
        coordinator.generation_if_stable() is None or time.monotonic() - recorder.changed < QUIET
    ):
        time.sleep(0.05)
    recorder.record(FINAL, value=coordinator.member_id(), members=sorted(handler.owned))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="consensus_chaos.record.ownership")
    for name in ("--journal", "--prefix"):
        parser.add_argument(name, required=True)
    for name in ("--client", "--spawn"):
        parser.add_argument(name, type=int, required=True)
    for name in ("--session-timeout", "--request-timeout", "--lifetime"):
        parser.add_argument(name, type=float, required=True)
    add_log_level(parser)
    args, _ = parser.parse_known_args(argv)  # the storage workload's flags do not apply
    resources = [f"r{index}" for index in range(RESOURCES)]

    def start(session: Session, journal: Journal) -> Workload:
        recorder = Recorder(journal)
        handler = ResourceHandler(resources, recorder, assignors=["cooperative-sticky"])
        recorder.record("subscribed", members=resources)
        coordinator = recorder.coordinator = handler.join(
            session, f"{args.prefix}/owners", rebalance_timeout=args.session_timeout * 2
        )
        try:
            coordinator.ensure_active_group(4 * args.session_timeout + 4 * args.request_timeout)
        except ConsensusError as exc:  # joins later; the workload is the group's life under faults
            print(f"not yet joined: {type(exc).__name__}: {exc}", file=sys.stderr)

        def run(parent: Parent, deadline: float) -> None:
            parent.stop.wait(max(0.0, deadline - time.monotonic()))

        return Workload(run, lambda: record_final(handler, coordinator, recorder))

    return serve(args, start)


if __name__ == "__main__":
    sys.exit(main())
