"""Check a linearizable history of 1,000,000 operations over 100,000 keys with the Spark job and locally.

The history comes from a real simulation of concurrent clients on versioned
registers: per key, three sequential clients issue fetch, put, update (half of
them with the version the client last saw) and delete (likewise) with
overlapping random intervals; each operation takes effect at a random point
inside its interval, and its output is what the register returned there.
About 2 % of the writes end with an unknown outcome (``info``): half of them
took effect, and their client continues as a new process. Keys start at
random times within the run, so their histories interleave.

    .venv/bin/python benchmarks/check_1m.py [--ops N] [--keys K] [--master local[2]] [--no-local]

Prints the generation time, the Spark time (start-up included) and the local
engine's time, and exits non-zero unless both engines pass every check.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from consensus_api.checker import check_history
from consensus_api.checker.spark import spark_session
from consensus_api.history.schema import COLUMNS, arrow_schema

CLIENTS_PER_KEY = 3
KEYS_PER_CHUNK = 10_000
MS = 1_000_000


def simulate_key(
    key_index: int, n_ops: int, rng: random.Random, columns: dict[str, list[Any]], ids: list[int]
) -> None:
    """Append the rows of one key's simulated history to ``columns``; ``ids`` = [next op id, next process]."""
    key = f"bench/k{key_index}"
    planned = []  # (effect time, call, ret, client, f, info)
    per_client = [n_ops // CLIENTS_PER_KEY + (c < n_ops % CLIENTS_PER_KEY) for c in range(CLIENTS_PER_KEY)]
    base = rng.randrange(600_000) * MS
    for client, count in enumerate(per_client):
        t = base + rng.randrange(5 * MS)
        for _ in range(count):
            duration = rng.randrange(MS // 2, 6 * MS)
            f = rng.choices(("fetch", "put", "update", "delete"), (40, 15, 30, 15))[0]
            info = f != "fetch" and rng.random() < 0.02
            planned.append((t + rng.randrange(duration), t, t + duration, client, f, info))
            t += duration + rng.randrange(3 * MS)
    value: str | None = None
    version = 0
    seen = [0] * CLIENTS_PER_KEY
    process = [0] * CLIENTS_PER_KEY
    for c in range(CLIENTS_PER_KEY):
        process[c], ids[1] = ids[1], ids[1] + 1
    for _, call, ret, client, f, info in sorted(planned):
        expected = seen[client] if f in ("update", "delete") and rng.random() < 0.5 and seen[client] else None
        written = f"v{key_index}.{ids[0]}" if f in ("put", "update") else None
        out: dict[str, Any] = {}
        if f == "fetch":
            outcome = "ok"
            out = {"value": value, "version": version if value is not None else None}
            if value is not None:
                seen[client] = version
        elif f == "put" and value is not None:
            outcome, out = "fail", {"error": "KeyExistsError"}
        elif f != "put" and value is None:
            outcome, out = "fail", {"error": "KeyNotFoundError"}
        elif expected is not None and expected != version:
            outcome, out = "fail", {"error": "VersionConflictError"}
        else:
            outcome = "ok"
            if not info or rng.random() < 0.5:
                version += 1
                value = written if f != "delete" else None
                out = {"version": version} if f != "delete" else {}
                seen[client] = version
        if info:
            outcome, out = "info", {"error": "OperationTimeoutError"}
        common = {"key": key, "op_id": ids[0], "process": process[client], "client": client, "f": f}
        _row(
            columns,
            {**common, "type": "invoke", "value": written, "expected_version": expected, "time_ns": call},
        )
        _row(
            columns,
            {
                **common,
                "type": outcome,
                "value": written,
                "expected_version": expected,
                "time_ns": ret,
                **out,
            },
        )
        ids[0] += 1
        if info:  # the client gives up on the op and continues as a new process
            process[client], ids[1] = ids[1], ids[1] + 1


def _row(columns: dict[str, list[Any]], row: dict[str, Any]) -> None:
    for name, column in columns.items():
        column.append(row.get(name))


def generate(directory: Path, n_ops: int, n_keys: int, seed: int) -> int:
    """Write the history as Parquet row groups of ``KEYS_PER_CHUNK`` keys; returns the row count."""
    rng = random.Random(seed)
    schema = arrow_schema()
    ids = [0, 0]
    rows = 0
    with pq.ParquetWriter(directory / "bench.parquet", schema, compression="zstd") as writer:
        for first in range(0, n_keys, KEYS_PER_CHUNK):
            columns: dict[str, list[Any]] = {name: [] for name in COLUMNS}
            for key_index in range(first, min(n_keys, first + KEYS_PER_CHUNK)):
                simulate_key(key_index, n_ops // n_keys + (key_index < n_ops % n_keys), rng, columns, ids)
            size = len(columns["time_ns"])
            columns.update(run=["bench"] * size, backend=["simulated"] * size, kind=["kv"] * size)
            writer.write_table(pa.Table.from_pydict(columns, schema=schema))
            rows += size
    return rows


def cpu_seconds(root: int) -> float:
    """CPU time (user + system, with reaped children) of ``root`` and its live descendants, from /proc."""
    children: dict[int, list[int]] = {}
    stats: dict[int, list[str]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        pid = int(stat.parent.name)
        stats[pid] = fields
        children.setdefault(int(fields[1]), []).append(pid)
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        if pid in stats:
            total += sum(int(stats[pid][i]) for i in (11, 12, 13, 14))  # utime stime cutime cstime
    return total / os.sysconf("SC_CLK_TCK")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ops", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--no-local", action="store_true", help="Skip the local engine.")
    args = parser.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="check-1m-"))
    try:
        began = time.monotonic()
        rows = generate(directory, args.ops, args.keys, args.seed)
        size = (directory / "bench.parquet").stat().st_size / 2**20
        print(
            f"generated {args.ops} ops ({rows} rows, {size:.0f} MiB) over {args.keys} keys "
            f"in {time.monotonic() - began:.1f} s"
        )
        began = time.monotonic()
        session = spark_session(args.master)
        started = time.monotonic() - began
        jvm = session.sparkContext._gateway.proc.pid
        cpu_before = cpu_seconds(jvm)
        spark = check_history(directory, "spark", session=session)
        spark_seconds = time.monotonic() - began
        cpu = cpu_seconds(jvm) - cpu_before
        checking = sum(check.ms for check in spark.checks.values()) / 1000
        print(
            f"spark ({args.master}): {spark_seconds:.1f} s in all = start-up {started:.1f} s + job "
            f"{spark_seconds - started:.1f} s (per-key checks {checking:.1f} s summed over workers; "
            f"the job used {cpu:.1f} s of CPU in the JVM and its Python workers); "
            f"exit code {spark.exit_code}, {spark.checks['linearizability'].objects} keys"
        )
        ok = spark.exit_code == 0
        if not args.no_local:
            began, cpu_before = time.monotonic(), time.process_time()
            local = check_history(directory, "local")
            cpu = time.process_time() - cpu_before
            checking = sum(check.ms for check in local.checks.values()) / 1000
            print(
                f"local engine: {time.monotonic() - began:.1f} s (per-key checks {checking:.1f} s, "
                f"{cpu:.1f} s of CPU), "
                f"exit code {local.exit_code}"
            )
            ok = ok and local.exit_code == 0
        return 0 if ok else 1
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
