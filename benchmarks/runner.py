"""One backend's benchmark run: every workload against one URL, into one JSON-ready report."""

from __future__ import annotations

import os
import time
import traceback
from collections.abc import Callable, Iterable
from typing import Any

from benchmarks import (
    aio_overhead,
    cutover_gap,
    detection,
    failover,
    idle,
    membership,
    ops,
    propagation,
    scale,
    scale_observers,
)
from benchmarks.core import Plan, Row, run_id
from benchmarks.raw import open_raw
from consensus_api import Session, config, connect

WORKLOADS = ("idle", "ops", "aio", "propagation", "membership", "failover", "detection", "scale", "cutover")

Progress = Callable[[str], None]


def _ops(session: Session, url: str, plan: Plan, run: str) -> list[Row]:
    raw = open_raw(url, run)
    try:
        return ops.run(session, raw, plan, run)
    finally:
        raw.close()


def _workload(name: str, session: Session, url: str, plan: Plan, run: str) -> list[Row]:
    if name == "idle":
        return idle.run(url, plan, run)
    if name == "ops":
        return _ops(session, url, plan, run)
    if name == "aio":
        return aio_overhead.run(session, url, plan, run)
    if name == "propagation":
        return propagation.run(session, url, plan, run)
    if name == "membership":
        return membership.run(session, url, plan, run)
    if name == "failover":
        return failover.run(url, session.backend, plan, run)
    if name == "detection":
        return detection.run(url, plan, run)
    if name == "cutover":
        return cutover_gap.run(url, session.backend, plan, run)
    return scale.run(url, plan) + scale_observers.run(url, session.backend, plan)


def run(
    url: str, *, quick: bool, only: Iterable[str] = WORKLOADS, progress: Progress = print
) -> dict[str, Any]:
    """Run the workloads ``only`` names against ``url``; ``{"backend", "results", ...}``.

    A workload that fails yields one row with a ``note`` saying why and no
    numbers; the other workloads still run.
    """
    plan = Plan.make(quick)
    run_name = run_id()
    rows: list[Row] = []
    load_before = os.getloadavg()
    started = time.monotonic()
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    with connect(url) as session:
        backend = session.backend
        for name in WORKLOADS:
            if name not in only:
                continue
            progress(f"{backend}: {name}…")
            began = time.monotonic()
            try:
                rows.extend(_workload(name, session, url, plan, run_name))
            except Exception as exc:
                progress(traceback.format_exc(limit=4))
                rows.append(Row(name, None, None, note=f"failed: {type(exc).__name__}: {exc}"))
            progress(f"{backend}: {name} done in {time.monotonic() - began:.0f} s")
    return {
        "backend": backend,
        "url": config.parse_url(url)[0].redacted(),
        "quick": quick,
        "started": stamp,
        "scale_note": plan.scale_note() or None,
        "elapsed_s": round(time.monotonic() - started, 1),
        "cpus": os.cpu_count(),
        "load_before": [round(value, 2) for value in load_before],
        "load_after": [round(value, 2) for value in os.getloadavg()],
        "results": [row.as_json() for row in rows],
    }
