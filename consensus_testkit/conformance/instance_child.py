"""A static member (KIP-345) in a child process, for the duplicate-instance tests, and its handle.

``python -m consensus_testkit.conformance.instance_child GROUP INSTANCE [--opt NAME=VALUE]...``
(``mode=cooperative|incremental`` and ``rebalance_timeout=S`` among the options, the others are
session options) connects, says ``CONNECTED``, and on the command ``JOIN`` joins GROUP as the
static member INSTANCE over ``RESOURCES``: a cooperative ``ResourceHandler`` or an incremental
coordinator. It reports with the wall clock (``time.time()``, one clock for every process of the
machine), so that a test can order the callbacks of several processes:

* ``ASSIGNED <t> <r,...>``: ``on_assigned``, ``t`` taken as it starts (the resources start);
* ``REVOKED <t> <r,...>``: ``on_revoked``, ``t`` taken as it returns (they are stopped);
* ``READY`` once it first took part (``ensure_active_group`` returned), ``FENCED`` once a later
  start of its instance fenced it (``FencedError``), ``ERROR <class> <message>`` for anything else.

It lives until its stdin closes or its lifetime ends.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Mapping, Sequence

from consensus_api import (
    ConsensusError,
    Coordinator,
    FencedError,
    IncrementalCoordinator,
    OperationTimeoutError,
    ResourceHandler,
    connect,
)
from consensus_api.children import say
from consensus_testkit.conformance.child import ChildProcess, child_options, child_start

RESOURCES = frozenset(f"r{index}" for index in range(6))
MODES = ("cooperative", "incremental")
#: How long one wait of the member's ``ensure_active_group`` lasts before the child looks again.
LOOK = 0.5


class InstanceChild(ChildProcess):
    """The parent's handle: the child ``name`` started as ``instance`` of ``group``."""

    def __init__(
        self, url: str, group: str, instance: str, options: Mapping[str, object], *, name: str
    ) -> None:
        module = "consensus_testkit.conformance.instance_child"
        super().__init__(module, [group, instance], url, options, name=name)

    def owned(self) -> frozenset[str]:
        """What it owns according to its reports so far."""
        owned: set[str] = set()
        for kind, _, resources in self.reports():
            (owned.update if kind == "ASSIGNED" else owned.difference_update)(resources)
        return frozenset(owned)

    def reports(self) -> list[tuple[str, float, frozenset[str]]]:
        """Its ``ASSIGNED``/``REVOKED`` reports: (kind, wall clock, resources), in order."""
        found = []
        for line in self.lines.events:
            kind, _, rest = line.partition(" ")
            if kind in ("ASSIGNED", "REVOKED"):
                at, _, names = rest.partition(" ")
                found.append((kind, float(at), frozenset(names.split(","))))
        return found


class _Reporting:
    def on_assigned(self, resources: frozenset[str]) -> None:
        say("ASSIGNED", f"{time.time():.6f}", ",".join(sorted(resources)))

    def on_revoked(self, resources: frozenset[str]) -> None:
        say("REVOKED", f"{time.time():.6f}", ",".join(sorted(resources)))


def main(argv: Sequence[str] | None = None) -> int:
    parser = child_options(
        argparse.ArgumentParser(prog="python -m consensus_testkit.conformance.instance_child")
    )
    parser.add_argument("group")
    parser.add_argument("instance")
    args = parser.parse_args(argv)
    parent, options = child_start(args, grace=5)
    mode = options.pop("mode", MODES[0])
    rebalance = float(options.pop("rebalance_timeout", 10))
    try:
        with connect(os.environ["CONSENSUS_URL"], **options) as session:
            say("CONNECTED")
            if not parent.wait_for("JOIN"):
                return 0
            member: Coordinator | IncrementalCoordinator
            if mode == "incremental":
                member = session.incremental_coordinator(
                    args.group,
                    RESOURCES,
                    _Reporting(),
                    rebalance_timeout=rebalance,
                    group_instance_id=args.instance,
                )
            else:
                handler = ResourceHandler(RESOURCES, _Reporting(), assignors=["cooperative-sticky"])
                member = handler.join(
                    session, args.group, rebalance_timeout=rebalance, group_instance_id=args.instance
                )
            ready = False
            while not parent.stop.is_set():
                try:
                    member.ensure_active_group(LOOK)
                except FencedError:
                    say("FENCED")
                    break
                except OperationTimeoutError:
                    continue
                if not ready:
                    ready = True
                    say("READY")
                parent.stop.wait(LOOK)
            parent.stop.wait(parent.deadline - time.monotonic())
    except ConsensusError as exc:
        say("ERROR", type(exc).__name__, exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
