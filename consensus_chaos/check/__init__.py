"""Checking recorded histories (``consensus check``): linearizability, elections, membership, listeners,
locks, migrations' cut-overs.

``check_history(location, engine="spark" | "local")`` reads every Parquet
history in a directory (see docs/history-format.md) and returns an
:class:`Outcome`; both engines run the same per-object checks and reach the
same verdicts (the per-object checks in buckets, the ``locks`` and ``cutover`` checks once per run).
With Spark the location may be any URL the executors read (``file://`` on
shared storage, ``s3a://``, ``hdfs://``): the executors read the history and
run the checker's code the job ships them (``checker.spark_io``).
``check_files(path, "jepsen-log" | "jepsen-edn", "register" | "kv")``
checks Jepsen histories, one verdict per file (``checker.external``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from consensus_api.errors import ConfigurationError
from consensus_chaos.check import cutover, locks
from consensus_chaos.check.external import check_files
from consensus_chaos.check.local import history_files, run_backends, run_local
from consensus_chaos.check.result import Outcome
from consensus_chaos.check.spark import check_memory, history_frame, run_sizes, run_spark, spark_session
from consensus_chaos.check.spark_io import history_url, local_path, readable
from consensus_chaos.check.wgl import Budget

__all__ = ["Budget", "Outcome", "check_files", "check_history"]
ENGINES = ("spark", "local")


def check_history(
    location: Path | str,
    engine: str = "spark",
    budget: Budget | None = None,
    master: str = "local[*]",
    *,
    session: Any = None,
    driver_memory: str = "2g",
) -> Outcome:
    """Check the histories at ``location``: a directory, or with Spark a URL its executors read;
    ``session`` reuses a running SparkSession, else one is started with ``master`` and
    ``driver_memory``. ``ConfigurationError`` when there is no history there or Spark cannot read it."""
    if engine not in ENGINES:
        raise ConfigurationError(f"unknown engine {engine!r}; expected spark or local")
    if engine == "spark":
        check_memory(driver_memory)
    directory = local_path(location)
    if directory is not None and not history_files(directory):
        raise ConfigurationError(f"no history (*.parquet) in {directory}")
    budget = budget or Budget()
    began = time.monotonic()
    if engine == "local":
        if directory is None:
            raise ConfigurationError(f"the local engine reads local directories, not {location}: use Spark")
        tables = [run_local(directory, budget), locks.check_local(directory), cutover.check_local(directory)]
        runs = run_backends(history_files(directory))
    else:
        session = session or spark_session(master, driver_memory)
        url = history_url(location)
        with readable(url):
            frame = history_frame(session, url)
            runs, rows = run_sizes(frame)
            tables = [
                run_spark(frame, rows, budget, session),
                locks.check_spark(frame),
                cutover.check_spark(frame),
            ]
    outcome = Outcome.from_rows([row for table in tables for row in table.to_pylist()], engine)
    outcome.runs = runs
    outcome.seconds = time.monotonic() - began
    return outcome
