"""Checking recorded histories (``consensus check``): linearizability, elections, membership, listeners,
locks.

``check_history(directory, engine="spark" | "local")`` reads every Parquet
history in ``directory`` (see docs/history-format.md) and returns an
:class:`Outcome`; both engines run the same per-object checks and reach the
same verdicts (the per-object checks in buckets, the ``locks`` check once per run).
``check_files(path, "jepsen-log" | "jepsen-edn", "register" | "kv")``
checks Jepsen histories, one verdict per file (``checker.external``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from consensus_api.errors import ConfigurationError
from consensus_chaos.check import locks
from consensus_chaos.check.external import check_files
from consensus_chaos.check.local import history_files, run_backends, run_local
from consensus_chaos.check.result import Outcome
from consensus_chaos.check.spark import check_memory, run_spark, spark_session
from consensus_chaos.check.wgl import Budget

__all__ = ["Budget", "Outcome", "check_files", "check_history"]


def check_history(
    directory: Path,
    engine: str = "spark",
    budget: Budget | None = None,
    master: str = "local[*]",
    *,
    session: Any = None,
    driver_memory: str = "2g",
) -> Outcome:
    """Check the histories in ``directory``; ``session`` reuses a running SparkSession, else one is
    started with ``master`` and ``driver_memory``."""
    if engine == "spark":
        check_memory(driver_memory)
    paths = history_files(directory)
    if not paths:
        raise ConfigurationError(f"no history (*.parquet) in {directory}")
    budget = budget or Budget()
    began = time.monotonic()
    if engine == "local":
        tables = [run_local(directory, budget), locks.check_local(directory)]
    elif engine == "spark":
        session = session or spark_session(master, driver_memory)
        tables = [run_spark(directory, budget, session), locks.check_spark(directory, session)]
    else:
        raise ConfigurationError(f"unknown engine {engine!r}; expected spark or local")
    outcome = Outcome.from_rows([row for table in tables for row in table.to_pylist()], engine)
    outcome.runs = run_backends(paths)
    outcome.seconds = time.monotonic() - began
    return outcome
