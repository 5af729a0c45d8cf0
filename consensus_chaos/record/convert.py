"""Turn the journals of a run into one Parquet history file.

Guarantees: ``process`` is unique per (client process, incarnation), so every
process is sequential; ``op_id`` is unique per operation within the run; an
operation whose process died with it outstanding (no completion record) gets
an ``info`` completion, error ``crashed``, at the time its process was killed
(or the end of the run). Rows are sorted by ``time_ns``. A journal with a negative
spawn number (the nemesis, the migration driver) keeps it as its process.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from consensus_chaos.record.journal import read_journal
from consensus_chaos.record.schema import (
    COLUMNS,
    COMPLETIONS,
    INFO,
    INVOKE,
    NEMESIS_PROCESS,
    arrow_schema,
)


def collect(
    journals: Iterable[Path], run: str, backend: str, kill_ns: Mapping[int, int], end_ns: int
) -> list[dict[str, Any]]:
    """The history rows of a run, from its journals (see the module docstring)."""
    records = [record for path in journals for record in read_journal(path)]
    records.sort(key=lambda record: record["time_ns"])
    processes: dict[tuple[int, int], int] = {}
    op_ids: dict[tuple[int, int], int] = {}
    open_ops: dict[tuple[int, int], dict[str, Any]] = {}
    rows: list[dict[str, Any]] = []
    for record in records:
        spawn, seq = record.get("spawn", NEMESIS_PROCESS), record.get("seq")
        ident = (spawn, record.get("inc", 0))
        driver = spawn < 0  # the nemesis, or the migration driver: its spawn is its process
        process = spawn if driver else processes.setdefault(ident, len(processes))
        row = {name: record.get(name) for name in COLUMNS}
        row.update(run=run, backend=backend, process=process)
        if seq is not None:
            op_key = (spawn, seq)
            row["op_id"] = op_ids.setdefault(op_key, len(op_ids))
            if record["type"] == INVOKE:
                open_ops[op_key] = row
            elif record["type"] in COMPLETIONS:
                open_ops.pop(op_key, None)
        rows.append(row)
    for (spawn, _), invoke in open_ops.items():
        crashed = dict(
            invoke, type=INFO, error="crashed", time_ns=max(kill_ns.get(spawn, end_ns), invoke["time_ns"])
        )
        crashed.update({"version": None, "members": None})
        rows.append(crashed)
    rows.sort(key=lambda row: row["time_ns"])
    return rows


def write_history(rows: list[dict[str, Any]], path: Path) -> None:
    """Write ``rows`` as one Parquet file (zstd), atomically (temp file, then rename)."""
    table = pa.Table.from_pylist(rows, schema=arrow_schema())
    partial = path.with_suffix(".partial")
    pq.write_table(table, partial, compression="zstd")
    partial.replace(path)


def summarize(rows: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Counts per ``kind/type`` (e.g. ``kv/ok``), plus ``processes``."""
    counts: Counter[str] = Counter()
    processes = set()
    for row in rows:
        counts[f"{row['kind']}/{row['type']}"] += 1
        processes.add(row["process"])
    counts["processes"] = len({process for process in processes if process >= 0})
    return dict(counts)
