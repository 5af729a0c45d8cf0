"""Check a 10,000,000-operation history over 1,000,000 keys with ``consensus check`` on Spark and locally.

Generates the history with ``benchmarks.histories`` (deterministic, written in
chunks), then times the real command end to end, JVM start-up included:
``consensus check DIR --master local[2] --driver-memory 1g`` (a heap far
below the history's size: nothing collects it to the driver), and the local
engine (``--engine local``) on a slice of whole keys (the first files, by
default a tenth of the history: it holds the slice in one process) in the
same run; prints ops/s of both. With ``--violation`` it also checks the
same-size history with one planted stale read and requires exit status 1
with exactly that key reported.

    PYTHONPATH=. .venv/bin/python -m benchmarks.check_scale [--ops N] [--keys K] [--local-ops N]
        [--master local[2]] [--driver-memory 1g] [--violation] [--quick]

Exits non-zero unless every verdict is the expected one.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks import histories

ROOT = Path(__file__).resolve().parent.parent


def consensus(directory: Path, *options: str) -> tuple[float, float, dict[str, Any]]:
    """Run ``consensus check DIR --json OPTIONS``; its wall time, the CPU seconds of its process tree
    (the JVM and Python workers included, sampled every half second) and its JSON output."""
    command = Path(sys.executable).with_name("consensus")
    argv = [str(command)] if command.exists() else [sys.executable, "-m", "consensus_api.cli"]
    began = time.monotonic()
    process = subprocess.Popen(
        [*argv, "check", str(directory), "--json", *options],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen: dict[int, float] = {}
    done = threading.Event()
    sampler = threading.Thread(target=_sample, args=(process.pid, seen, done), daemon=True)
    sampler.start()
    stdout, stderr = process.communicate()
    seconds = time.monotonic() - began
    done.set()
    sampler.join()
    try:
        return seconds, sum(seen.values()), json.loads(stdout)
    except json.JSONDecodeError:
        raise SystemExit(f"consensus check failed ({process.returncode}): {stderr[-2000:]}") from None


def _sample(root: int, seen: dict[int, float], done: threading.Event) -> None:
    """Record the CPU seconds (own and reaped children's) of ``root`` and its descendants until ``done``."""
    tick = os.sysconf("SC_CLK_TCK")
    while not done.wait(0.5):
        children: dict[int, list[int]] = {}
        fields: dict[int, list[str]] = {}
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields[int(stat.parent.name)] = parts = stat.read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            children.setdefault(int(parts[1]), []).append(int(stat.parent.name))
        todo = [root]
        while todo:
            pid = todo.pop()
            todo += children.get(pid, [])
            if pid in fields:
                seen[pid] = sum(int(fields[pid][i]) for i in (11, 12, 13, 14)) / tick


def local_slice(directory: Path, ops: int, total_ops: int, target: Path) -> int:
    """Link the first files of ``directory`` into ``target``, about ``ops`` operations; returns their ops."""
    files = sorted(directory.glob("*.parquet"))
    count = max(1, min(len(files), round(len(files) * ops / total_ops)))
    target.mkdir()
    for path in files[:count]:
        (target / path.name).symlink_to(path)
    return total_ops * count // len(files)


def rate(ops: int, seconds: float, cpu: float) -> str:
    return f"{ops:,} ops in {seconds:.1f} s = {ops / seconds:,.0f} ops/s ({cpu:.0f} s of CPU)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ops", type=int, default=10_000_000)
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--local-ops", type=int, default=None, help="default: a tenth of --ops")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--driver-memory", default="1g")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--violation", action="store_true", help="Also check a history with a stale read.")
    parser.add_argument("--quick", action="store_true", help="1,000,000 ops over 100,000 keys.")
    args = parser.parse_args(argv)
    if args.quick:
        args.ops, args.keys = 1_000_000, 100_000
    local_ops = args.local_ops or args.ops // 10
    work = Path(tempfile.mkdtemp(prefix="check-scale-"))
    spark_options = ("--master", args.master, "--driver-memory", args.driver_memory)
    ok = True
    try:
        began = time.monotonic()
        rows = histories.generate(work / "valid", args.ops, args.keys, args.seed)
        size = sum(p.stat().st_size for p in (work / "valid").iterdir()) / 2**20
        print(
            f"generated {args.ops:,} ops ({rows:,} rows, {size:.0f} MiB Parquet) over {args.keys:,} keys "
            f"in {time.monotonic() - began:.1f} s; load average {os.getloadavg()[0]:.1f}",
            flush=True,
        )
        seconds, cpu, spark = consensus(work / "valid", *spark_options)
        print(
            f"spark ({args.master}, driver {args.driver_memory}), start-up included: "
            f"{rate(args.ops, seconds, cpu)}; exit {spark['exit_code']}",
            flush=True,
        )
        ok = spark["exit_code"] == 0 and spark["checks"]["linearizability"]["objects"] == args.keys
        sliced = local_slice(work / "valid", local_ops, args.ops, work / "slice")
        part = "the whole history" if sliced == args.ops else f"a slice of whole keys ({sliced:,} ops)"
        seconds_local, cpu, local = consensus(work / "slice", "--engine", "local")
        print(f"local engine on {part}: {rate(sliced, seconds_local, cpu)}; exit {local['exit_code']}")
        print(
            f"spark / local ops/s: {args.ops / seconds / (sliced / seconds_local):.2f}; "
            f"load average {os.getloadavg()[0]:.1f}",
            flush=True,
        )
        ok = ok and local["exit_code"] == 0
        if args.violation:
            shutil.rmtree(work / "valid")
            histories.generate(work / "bad", args.ops, args.keys, args.seed, violation=True)
            seconds, cpu, bad = consensus(work / "bad", *spark_options)
            found = sorted({f["key"] for f in bad["findings"]})
            expected = [histories.planted_key(args.keys)]
            print(
                f"planted stale read: spark {rate(args.ops + 1, seconds, cpu)}; exit {bad['exit_code']}, "
                f"violations on {found} (planted on {expected[0]})"
            )
            ok = ok and bad["exit_code"] == 1 and found == expected
        return 0 if ok else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
