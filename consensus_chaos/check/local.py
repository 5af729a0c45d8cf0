"""The local engine: the same per-bucket function as the Spark job, in this process.

Objects are never split between calls, so verdicts equal the Spark job's.
The history is checked in slices of whole objects to bound memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from consensus_chaos.check import wgl
from consensus_chaos.check.bucket import (
    INPUT_COLUMNS,
    MEMBERS_SEPARATOR,
    check_table,
    object_ends,
    output_schema,
)
from consensus_chaos.record.schema import arrow_schema

SLICE_ROWS = 200_000


def history_files(directory: Path) -> list[Path]:
    """The Parquet files of a history directory, sorted."""
    return sorted(path for path in directory.glob("*.parquet") if path.is_file())


def run_backends(paths: Sequence[Path]) -> dict[str, str]:
    """The backend of each run in ``paths``, read from the files' two columns (cheap: dictionary-encoded)."""
    runs: dict[str, str] = {}
    for path in paths:
        table = pq.read_table(path, columns=["run", "backend"])
        for row in table.group_by(["run", "backend"]).aggregate([]).to_pylist():
            runs[row["run"]] = row["backend"]
    return runs


def read_history(paths: Sequence[Path]) -> Any:
    """All rows of ``paths`` as one ``pyarrow.Table`` in the history schema (a column a file recorded
    before it existed is null)."""
    schema = arrow_schema()
    tables = []
    for path in paths:
        table = pq.read_table(path)
        for name in set(schema.names) - set(table.column_names):
            table = table.append_column(name, pa.nulls(table.num_rows, schema.field(name).type))
        tables.append(table.select(schema.names).cast(schema))
    return pa.concat_tables(tables)


def project(table: Any) -> Any:
    """Rows per checked object: ``okind`` and ``object`` added, fenced writes also under their service,
    ``members`` joined into one string."""
    kind = table.column("kind")
    parts = []
    for okind, mask, name in (
        ("kv", pc.equal(kind, "kv"), "key"),
        (
            "election",
            pc.or_(
                pc.equal(kind, "election"),
                pc.and_(pc.equal(kind, "kv"), pc.is_valid(table.column("service"))),
            ),
            "service",
        ),
        ("group", pc.equal(kind, "group"), "key"),
        ("nemesis", pc.equal(kind, "nemesis"), None),
    ):
        part = table.filter(mask)
        joined = pc.binary_join(part.column("members"), MEMBERS_SEPARATOR)
        part = part.set_column(part.schema.get_field_index("members"), "members", joined)
        obj = part.column(name) if name else pa.nulls(part.num_rows, pa.string())
        part = part.append_column("okind", pa.array([okind] * part.num_rows, pa.string()))
        parts.append(part.append_column("object", obj.cast(pa.string())))
    return pa.concat_tables(parts).select(list(INPUT_COLUMNS))


def run_local(directory: Path, budget: wgl.Budget) -> Any:
    """Check the history in ``directory``; returns the output table (``bucket.output_schema``)."""
    table = project(read_history(history_files(directory)))
    table = table.sort_by([("run", "ascending"), ("okind", "ascending"), ("object", "ascending")])
    ends = object_ends(table)
    outputs = [output_schema().empty_table()]
    start = 0
    for index, end in enumerate(ends):
        if end - start >= SLICE_ROWS or index == len(ends) - 1:
            outputs.append(check_table(table.slice(start, end - start), budget))
            start = end
    return pa.concat_tables(outputs)
