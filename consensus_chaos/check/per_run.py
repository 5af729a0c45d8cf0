"""What the per-run checks (resource ownership, locks) share: the nemesis's faults per client slot,
and running a check once per run, in this process or as one Spark task per run
(``groupBy(run).applyInArrow``).

A per-run check sees every row of its kinds in one run together with the
nemesis rows, so it can tell when a client slot was paused, expired or
killed; the per-object checks of ``consensus check`` (``bucket``) cannot.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from consensus_chaos.check.local import history_files
from consensus_chaos.check.spark_io import ship_code

FAULT_WINDOWS = ("pause-client", "expire-session")
#: How long after a nemesis pause or expiry ends a client may take to notice it was fenced.
RESUME_SLACK_NS = 5_000_000_000
_SLOT = re.compile(r"client (\d+)")

Windows = dict[int, list[tuple[int, int | None]]]


def fault_windows(rows: Iterable[Mapping[str, Any]]) -> tuple[Windows, dict[int, list[int]]]:
    """Per client slot: the nemesis' pause / expiry windows (start, end or None), and kill times."""
    windows: defaultdict[int, list[tuple[int, int | None]]] = defaultdict(list)
    kills: defaultdict[int, list[int]] = defaultdict(list)
    started: dict[int, tuple[int, int]] = {}
    for row in rows:
        if row["kind"] != "nemesis" or row["value"] is None:
            continue
        match = _SLOT.match(str(row["value"]))
        if match is None:
            continue
        slot = int(match.group(1))
        if row["f"] == "kill-client" and row["type"] == "invoke":
            kills[slot].append(row["time_ns"])
        elif row["f"] in FAULT_WINDOWS and row["type"] == "invoke":
            started[int(row["op_id"])] = (slot, row["time_ns"])
        elif row["f"] in FAULT_WINDOWS and int(row["op_id"]) in started:
            slot, start = started.pop(int(row["op_id"]))
            windows[slot].append((start, row["time_ns"]))
    for slot, start in started.values():
        windows[slot].append((start, None))
    return dict(windows), dict(kills)


def faulted(windows: Windows, slot: int, at: int) -> bool:
    """Whether the nemesis had paused or expired client ``slot`` at ``at`` (or shortly before)."""
    return any(
        start <= at and (end is None or at <= end + RESUME_SLACK_NS) for start, end in windows.get(slot, [])
    )


def faulted_between(windows: Windows, slot: int, start: int, end: int) -> bool:
    """Whether the nemesis paused or expired client ``slot`` at any time from ``start`` to ``end``."""
    return any(
        began <= end and (ended is None or start <= ended + RESUME_SLACK_NS)
        for began, ended in windows.get(slot, [])
    )


def killed_at(slot: int, since: int, kills: Mapping[int, list[int]]) -> int | None:
    """The first SIGKILL of client ``slot`` at or after ``since``, or None."""
    after = [t for t in kills.get(slot, []) if t >= since]
    return min(after) if after else None


def check_local(
    directory: Path,
    *,
    kinds: tuple[str, ...],
    columns: tuple[str, ...],
    check: Callable[[list[Any]], pa.Table],
) -> pa.Table:
    """``check(rows)`` on the rows of ``kinds`` (and the nemesis's) of each run in ``directory``."""
    by_run: defaultdict[str, list[dict[str, Any]]] = defaultdict(list)
    wanted = [*kinds, "nemesis"]
    for path in history_files(directory):  # only the wanted kinds' rows become Python objects
        recorded = pq.read_schema(path).names
        present = [name for name in columns if name in recorded]  # a file older than a column lacks it
        absent = dict.fromkeys(name for name in columns if name not in present)
        for row in pq.read_table(path, columns=present, filters=[("kind", "in", wanted)]).to_pylist():
            by_run[row["run"]].append(absent | row)
    return pa.concat_tables([check(rows) for rows in by_run.values()] or [check([])])


def check_spark(
    frame: Any,
    *,
    kinds: tuple[str, ...],
    columns: tuple[str, ...],
    check: Callable[[list[Any]], pa.Table],
    ddl: str,
) -> pa.Table:
    """``check_local`` on the history DataFrame ``frame`` (``spark.history_frame``), one Spark task per
    run (``members`` arrives joined by commas)."""
    from pyspark.sql import functions as F  # noqa: N812, PLC0415 - pyspark, the optional spark extra

    ship_code(frame.sparkSession.sparkContext)
    frame = frame.select(*columns).filter(F.col("kind").isin(*kinds, "nemesis"))
    if "members" in columns:
        frame = frame.withColumn("members", F.array_join("members", ","))

    def check_table(table: pa.Table) -> pa.Table:
        return check(table.to_pylist())

    return frame.groupBy("run").applyInArrow(check_table, schema=ddl).toArrow()
