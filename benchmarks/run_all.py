"""``benchmarks/run``: every backend on a fresh real server, one after the other.

    benchmarks/run [--quick] [--only WORKLOADS] [BACKEND...]

For each backend (default: sqlite postgresql zookeeper etcd kafka) it starts
the server with ``consensus_testkit`` (SQLite: a temp file), runs
``consensus bench URL`` in a process of its own (which prints the tables),
writes ``benchmarks/results/<backend>.json`` (with ``--only``: replaces just
those workloads' rows in it) and stops the server, so that only one server
loads the machine at a time. Then it writes
``benchmarks/results/bench-tables.md`` and the plots under ``docs/``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks import check_scale, external_histories, plots, report
from consensus_api.config import redact_text
from consensus_testkit import start_server

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
BACKENDS = ("sqlite", "postgresql", "zookeeper", "etcd", "kafka")


def _bench(name: str, url: str, options: list[str]) -> int:
    consensus = Path(sys.executable).with_name("consensus")
    command = [str(consensus)] if consensus.exists() else [sys.executable, "-m", "consensus_api.cli"]
    output = RESULTS / f"{name}.json"
    partial = output.with_suffix(".partial.json")
    print(f"== {name}: {redact_text(url)}", flush=True)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "CONSENSUS_URL": url,  # expanded by the CLI: a password on the command line shows in ps
    }
    argv = [*command, "bench", "$CONSENSUS_URL", "--output", str(partial), *options]
    status = subprocess.call(argv, env=env)
    if partial.exists():
        _merge(partial, output, "--only" in options)
    return status


def _merge(partial: Path, output: Path, only: bool) -> None:
    """Move ``partial`` to ``output``; with ``--only``, replace just its workloads' rows in ``output``."""
    new = json.loads(partial.read_text())
    if only and output.exists():
        old = json.loads(output.read_text())
        families = {row["workload"].split(".")[0] for row in new["results"]}
        kept = [row for row in old["results"] if row["workload"].split(".")[0] not in families]
        rerun = {key: new.get(key) for key in ("started", "elapsed_s", "load_before", "load_after")}
        new = {**old, "results": kept + new["results"]}
        new["reruns"] = [*old.get("reruns", []), {"workloads": sorted(families), **rerun}]
    output.write_text(json.dumps(new, indent=2) + "\n")
    partial.unlink()


def run_backend(name: str, options: list[str]) -> int:
    """Start ``name``'s server, benchmark it, stop it; the bench command's exit status."""
    if name == "sqlite":
        directory = Path(tempfile.mkdtemp(prefix="consensus-bench-sqlite-"))
        try:
            return _bench(name, f"sqlite:///{directory / 'bench.db'}", options)
        finally:
            shutil.rmtree(directory, ignore_errors=True)
    server = start_server(name)
    try:
        return _bench(name, server.url, options)
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    """Benchmark the chosen backends; non-zero if any run failed."""
    parser = argparse.ArgumentParser(prog="benchmarks/run", description=__doc__.split("\n\n")[0])
    parser.add_argument("backends", nargs="*", metavar="BACKEND", help=f"default: {' '.join(BACKENDS)}")
    parser.add_argument("--quick", action="store_true", help="fewer samples, smaller scale")
    parser.add_argument("--only", help="comma-separated workloads (see consensus bench --help)")
    parser.add_argument("--no-plots", action="store_true", help="do not draw docs/*.png")
    args = parser.parse_args(argv)
    unknown = set(args.backends) - set(BACKENDS)
    if unknown:
        parser.error(f"unknown backends: {', '.join(sorted(unknown))}")
    options = ["--quick"] if args.quick else []
    if args.only:
        options += ["--only", args.only]
    RESULTS.mkdir(parents=True, exist_ok=True)
    status = 0
    for name in args.backends or BACKENDS:
        status = max(status, run_backend(name, options))
    if not args.backends and not args.only:  # the checker against external ground truth (no server)
        status = max(status, external_histories.main(["--repeat", "2"] if args.quick else []))
        # 10M operations checked on Spark local[2] and locally
        status = max(status, check_scale.main(["--quick"] if args.quick else ["--violation"]))
    reports = []
    for name in BACKENDS:
        path = RESULTS / f"{name}.json"
        if path.exists():
            reports.append(json.loads(path.read_text()))
    (RESULTS / "bench-tables.md").write_text("\n".join(report.markdown(r) for r in reports))
    print(f"wrote {RESULTS / 'bench-tables.md'}")
    for found in reports:
        print("\n".join([f"{found['backend']}:", *report.summary(found["results"])]))
    if not args.no_plots:
        for path in plots.draw(reports, ROOT / "docs"):
            print(f"wrote {path}")
    return status


if __name__ == "__main__":
    sys.exit(main())
