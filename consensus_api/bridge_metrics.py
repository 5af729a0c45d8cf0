"""Metrics of bridged sessions, with the ``otel`` extra (nothing is recorded without it).

* ``consensus.migration.bridged_sessions`` (up-down counter): bridged sessions open in this process,
  by ``consensus.migration.authority`` (``old``/``new``: the store they use);
* ``consensus.migration.moves`` (counter): times a bridged session moved, by the store it moved to.

``consensus migrate status --json`` shows the same across every process (the announcements).
"""

from __future__ import annotations

import functools
from typing import Any

from consensus_api.observability import otel_installed

AUTHORITY = "consensus.migration.authority"


@functools.cache
def _instruments() -> tuple[Any, Any] | None:
    if not otel_installed():
        return None
    from opentelemetry import metrics  # noqa: PLC0415 - the optional otel extra

    meter = metrics.get_meter("consensus_api")
    sessions = meter.create_up_down_counter(
        "consensus.migration.bridged_sessions", description="Bridged sessions open, by the store they use"
    )
    moves = meter.create_counter(
        "consensus.migration.moves", description="Moves of bridged sessions between stores, by destination"
    )
    return sessions, moves


def bridged(authority: str, delta: int) -> None:
    """A bridged session on the store ``authority`` opened (+1) or closed (-1)."""
    instruments = _instruments()
    if instruments is not None:
        instruments[0].add(delta, {AUTHORITY: authority})


def moved(leaving: str, arriving: str) -> None:
    """A bridged session moved from the store ``leaving`` to ``arriving``."""
    instruments = _instruments()
    if instruments is not None:
        instruments[0].add(-1, {AUTHORITY: leaving})
        instruments[0].add(1, {AUTHORITY: arriving})
        instruments[1].add(1, {AUTHORITY: arriving})
