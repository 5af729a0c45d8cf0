"""Time ``consensus check`` on Jepsen's etcd histories and porcupine's KV histories, side by side.

    PYTHONPATH=. .venv/bin/python -m benchmarks.external_histories [--repeat N] [--master M] [--no-spark]

The whole ``jepsen-etcd`` set on the local engine (best and median of
``--repeat`` runs, parsing included, split into parsing and search), next to
porcupine's published time for all 102 Jepsen etcd histories (0.55 s in Go on
this machine) scaled to the files present; then each ``kv`` file on both
engines (the Spark session is started once, its start-up printed apart).
Exits non-zero if a verdict differs from ``verdicts.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from consensus_chaos.check.external import check_files
from consensus_chaos.check.spark import spark_session

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "external-histories"
PORCUPINE_SECONDS = 0.55  # porcupine, all 102 Jepsen etcd histories
PORCUPINE_FILES = 102
TARGET_FACTOR = 3.0


def _timed(
    path: Path, fmt: str, model: str, engine: str, session: Any = None
) -> tuple[float, float, list[Any]]:
    """Wall seconds, the files' own seconds (parse and search) summed, and the verdicts."""
    began = time.perf_counter()
    verdicts = check_files(path, fmt, model, engine=engine, session=session)
    return time.perf_counter() - began, sum(v.seconds for v in verdicts), verdicts


def _wrong(verdicts: list[Any], expected: dict[str, bool]) -> list[str]:
    return [Path(v.path).name for v in verdicts if (v.verdict == "ok") != expected[Path(v.path).name]]


def etcd(data: Path, expected: dict[str, bool], repeat: int) -> list[str]:
    """The etcd set on the local engine; the files with a wrong verdict."""
    runs = [_timed(data / "jepsen-etcd", "jepsen-log", "register", "local") for _ in range(repeat)]
    walls = [wall for wall, _, _ in runs]
    verdicts = min(runs, key=lambda run: run[0])[2]  # the per-file times of the best run
    files, ops = len(verdicts), sum(v.operations for v in verdicts)
    scaled = PORCUPINE_SECONDS * files / PORCUPINE_FILES
    best = min(walls)
    print(f"jepsen-etcd: {files} histories, {ops} operations, local engine, {repeat} runs")
    print(f"  {'':<34}{'seconds':>10}{'x porcupine':>14}")
    print(f"  {'ours, best':<34}{best:>10.3f}{best / scaled:>14.2f}")
    print(
        f"  {'ours, median':<34}{statistics.median(walls):>10.3f}{statistics.median(walls) / scaled:>14.2f}"
    )
    print(f"  {'porcupine (Go), scaled to ' + str(files) + ' files':<34}{scaled:>10.3f}{1:>14.2f}")
    target = f"target: {TARGET_FACTOR:g}x porcupine"
    print(f"  {target:<34}{TARGET_FACTOR * scaled:>10.3f}{TARGET_FACTOR:>14.2f}")
    slowest = max(verdicts, key=lambda v: v.seconds)
    print(
        f"  slowest file: {Path(slowest.path).name} {slowest.seconds:.3f} s ({slowest.operations} operations)"
    )
    return _wrong(verdicts, expected)


def kv(data: Path, expected: dict[str, bool], master: str | None) -> list[str]:
    """Each kv file on both engines; the files with a wrong verdict."""
    session = None
    if master is not None:
        began = time.perf_counter()
        session = spark_session(master)
        print(f"Spark {master} start-up: {time.perf_counter() - began:.1f} s (not counted below)")
    wrong = []
    print(f"  {'kv file':<14}{'ops':>6}{'keys':>6}{'verdict':>11}{'local s':>10}{'spark s':>10}")
    for path in sorted((data / "kv").iterdir()):
        local, _, [verdict] = _timed(path, "jepsen-edn", "kv", "local")
        spark = "-"
        if session is not None:
            seconds, _, [distributed] = _timed(path, "jepsen-edn", "kv", "spark", session)
            spark = f"{seconds:.3f}"
            wrong += [path.name] if distributed.verdict != verdict.verdict else []
        wrong += _wrong([verdict], expected)
        cells = f"{verdict.operations:>6}{verdict.keys:>6}{verdict.verdict:>11}{local:>10.3f}{spark:>10}"
        print(f"  {path.name:<14}{cells}")
    if session is not None:
        session.stop()
    return wrong


def main(argv: list[str] | None = None) -> int:
    """Run both parts; 1 if a verdict is wrong."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--data", type=Path, default=DATA, help="a directory laid out as tests/data/external-histories"
    )
    parser.add_argument("--repeat", type=int, default=5, help="runs of the etcd set")
    parser.add_argument("--master", default="local[2]", help="Spark master for the kv files")
    parser.add_argument("--no-spark", action="store_true", help="local engine only")
    args = parser.parse_args(argv)
    expected = json.loads((args.data / "verdicts.json").read_text())
    wrong = etcd(args.data, expected["jepsen-etcd"], args.repeat)
    wrong += kv(args.data, expected["kv"], None if args.no_spark else args.master)
    if wrong:
        print(f"WRONG verdicts: {', '.join(wrong)}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
