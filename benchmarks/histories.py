"""Deterministic synthetic KV histories for the checker benchmarks, written as Parquet in chunks.

Per key, three sequential clients issue fetch, put, update (half of them with
the version the client last saw) and delete (likewise) on a versioned
register, with overlapping random intervals; each operation takes effect at a
random point inside its interval and its output is what the register
returned there. About 2 % of the writes end with an unknown outcome (``info``):
half of them took effect, and their client continues as a new process. Keys
start at random times within ten minutes, so their histories interleave.

Keys are generated in chunks of ``KEYS_PER_CHUNK``, one Parquet file each
(``part-NNNNN.parquet``), each from its own seed ``(seed, chunk)``: the
output depends only on the arguments, never on how many worker processes
write it, and no more than a few chunks are in memory at once. With
``violation=True`` the middle key gets one extra fetch, after all its other
operations, that returns the state before its last write (a stale read):
the history is then not linearizable on exactly that key (``planted_key``).

    PYTHONPATH=. .venv/bin/python -m benchmarks.histories DIR [--ops N] [--keys K] [--violation]
"""

from __future__ import annotations

import argparse
import multiprocessing
import random
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from consensus_chaos.record.schema import arrow_schema

CLIENTS_PER_KEY = 3
KEYS_PER_CHUNK = 10_000
MS = 1_000_000
ROW_COLUMNS = (
    *("key", "op_id", "process", "client", "f", "type"),
    *("value", "expected_version", "version", "error", "time_ns"),
)
KEY_STRIDE = 1 << 20  # op ids and process ids of key i start at i * KEY_STRIDE: unique in the run


def key_name(index: int) -> str:
    """The key of index ``index``."""
    return f"bench/k{index}"


def planted_key(n_keys: int) -> str:
    """The key that carries the stale read of a history generated with ``violation=True``."""
    return key_name(n_keys // 2)


def simulate_key(
    index: int, n_ops: int, rng: random.Random, columns: dict[str, list[Any]], stale_read: bool
) -> None:
    """Append the rows of key ``index``'s simulated history to ``columns``."""
    key = key_name(index)
    planned = []  # (effect time, call, ret, client, f, info)
    per_client = [n_ops // CLIENTS_PER_KEY + (c < n_ops % CLIENTS_PER_KEY) for c in range(CLIENTS_PER_KEY)]
    base = rng.randrange(600_000) * MS
    for client, count in enumerate(per_client):
        t = base + rng.randrange(5 * MS)
        for _ in range(count):
            duration = rng.randrange(MS // 2, 6 * MS)
            f = rng.choices(("fetch", "put", "update", "delete"), (40, 15, 30, 15))[0]
            info = f != "fetch" and not stale_read and rng.random() < 0.02
            planned.append((t + rng.randrange(duration), t, t + duration, client, f, info))
            t += duration + rng.randrange(3 * MS)
    op_id = next_process = index * KEY_STRIDE
    states: list[tuple[str | None, int | None]] = [(None, None)]  # after each effective write
    version = 0
    seen = [0] * CLIENTS_PER_KEY
    process = list(range(next_process, next_process + CLIENTS_PER_KEY))
    next_process += CLIENTS_PER_KEY
    for _, call, ret, client, f, info in sorted(planned):
        value = states[-1][0]
        expected = seen[client] if f in ("update", "delete") and rng.random() < 0.5 and seen[client] else None
        written = f"v{index}.{op_id}" if f in ("put", "update") else None
        outcome, read, out_version, error = "ok", None, None, None
        if f == "fetch":
            read, out_version = states[-1]
            if value is not None:
                seen[client] = version
        elif f == "put" and value is not None:
            outcome, error = "fail", "KeyExistsError"
        elif f != "put" and value is None:
            outcome, error = "fail", "KeyNotFoundError"
        elif expected is not None and expected != version:
            outcome, error = "fail", "VersionConflictError"
        elif not info or rng.random() < 0.5:
            version += 1
            states.append((written if f != "delete" else None, version if f != "delete" else None))
            out_version = version if f != "delete" else None
            seen[client] = version
        if info:
            outcome, out_version, error = "info", None, "OperationTimeoutError"
        _op(columns, (key, op_id, process[client], client, f, written, expected, call, ret), outcome, read)
        columns["version"][-1], columns["error"][-1] = out_version, error
        op_id += 1
        if info:  # the client gives up on the op and continues as a new process
            process[client], next_process = next_process, next_process + 1
    if stale_read:  # after everything, on a new process: the state before the last write
        end = max([ret for _, _, ret, *_ in planned], default=base) + MS
        read, out_version = states[-2] if len(states) > 1 else ("never-written", 1)
        _op(columns, (key, op_id, next_process, 0, "fetch", None, None, end, end + MS), "ok", read)
        columns["version"][-1] = out_version


def _op(columns: dict[str, list[Any]], op: tuple[Any, ...], outcome: str, read: str | None) -> None:
    """An operation's invoke row and its completion row (its ``version`` and ``error`` null)."""
    key, op_id, process, client, f, written, expected, call, ret = op
    for kind, time_ns, value in (("invoke", call, written), (outcome, ret, read)):
        columns["key"].append(key)
        columns["op_id"].append(op_id)
        columns["process"].append(process)
        columns["client"].append(client)
        columns["f"].append(f)
        columns["type"].append(kind)
        columns["value"].append(written if f != "fetch" else value)
        columns["expected_version"].append(expected)
        columns["version"].append(None)
        columns["error"].append(None)
        columns["time_ns"].append(time_ns)


def write_chunk(task: tuple[Path, int, int, int, int, bool]) -> int:
    """Write chunk ``chunk`` (keys ``chunk * KEYS_PER_CHUNK`` onwards) to its file; returns its row count."""
    directory, chunk, n_ops, n_keys, seed, violation = task
    rng = random.Random(seed * 1_000_003 + chunk)
    columns: dict[str, list[Any]] = {name: [] for name in ROW_COLUMNS}
    stale = planted_key(n_keys) if violation else None
    for index in range(chunk * KEYS_PER_CHUNK, min(n_keys, (chunk + 1) * KEYS_PER_CHUNK)):
        ops = n_ops // n_keys + (index < n_ops % n_keys)
        simulate_key(index, ops, rng, columns, key_name(index) == stale)
    size = len(columns["time_ns"])
    columns.update(run=["bench"] * size, backend=["simulated"] * size, kind=["kv"] * size)
    schema = arrow_schema()
    arrays = [
        pa.array(columns[field.name], field.type) if field.name in columns else pa.nulls(size, field.type)
        for field in schema
    ]
    table = pa.Table.from_arrays(arrays, schema=schema)
    pq.write_table(table, directory / f"part-{chunk:05d}.parquet", compression="zstd")
    return size


def generate(
    directory: Path, n_ops: int, n_keys: int, seed: int = 7, *, violation: bool = False, workers: int = 2
) -> int:
    """Write the history of ``n_ops`` operations over ``n_keys`` keys into ``directory``; returns its rows."""
    if n_keys < 1 or n_ops < n_keys:
        raise ValueError(f"need at least one key and one operation per key, got {n_ops} ops, {n_keys} keys")
    directory.mkdir(parents=True, exist_ok=True)
    chunks = (n_keys + KEYS_PER_CHUNK - 1) // KEYS_PER_CHUNK
    tasks = [(directory, chunk, n_ops, n_keys, seed, violation) for chunk in range(chunks)]
    if workers <= 1 or chunks == 1:
        return sum(map(write_chunk, tasks))
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        return sum(pool.imap_unordered(write_chunk, tasks))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--ops", type=int, default=10_000_000)
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--violation", action="store_true", help="Plant one stale read (see above).")
    args = parser.parse_args(argv)
    began = time.monotonic()
    rows = generate(
        args.directory, args.ops, args.keys, args.seed, violation=args.violation, workers=args.workers
    )
    planted = f"; stale read planted on {planted_key(args.keys)}" if args.violation else ""
    seconds = time.monotonic() - began
    print(f"wrote {rows} rows ({args.ops} ops, {args.keys} keys) in {seconds:.1f} s{planted}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
