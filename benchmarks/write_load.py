"""Liveness under write load: processes x threads of compare-and-set increments of one key.

    .venv/bin/python -m benchmarks.write_load sqlite:////tmp/load.db
    consensus servers run postgresql -- .venv/bin/python -m benchmarks.write_load '$CONSENSUS_URL'

``--processes`` child processes (8) each open one session (``session_timeout``
3 s, ``request_timeout`` 2 s) and run ``--threads`` threads (4) for
``--seconds`` (60): fetch the counter, ``update`` it to the next number at
the version read; a ``VersionConflictError`` is a lost race (read again). Each
child counts its acknowledged increments, its session's SUSPENDED and LOST
states and the errors its writes raised, split into "not applied" (the error
says so) and "effect unknown". The parent checks the counter's final value
against the acknowledged increments: equal when no write's effect was
unknown. Prints one JSON document and writes it to ``--output`` (default
``benchmarks/results/write-load-<backend>.json``). The URL reaches the children
through the environment, never a command line.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import consensus_api
from consensus_api import OperationTimeoutError, SessionState, VersionConflictError, config

ROOT = Path(__file__).resolve().parent.parent
URL_VARIABLE = "CONSENSUS_BENCH_URL"
KEY = "bench/write-load/counter"


def _child(seconds: float, threads: int, session_timeout: float, request_timeout: float) -> None:
    """One process: ``threads`` CAS loops on one session until ``seconds`` pass; prints its counts."""
    counts: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()

    def on_state(state: SessionState) -> None:
        with lock:
            counts[state.value] += 1

    url = os.environ[URL_VARIABLE]
    with consensus_api.connect(url, session_timeout=session_timeout, request_timeout=request_timeout) as s:
        s.add_state_listener(on_state)
        print("READY", flush=True)
        sys.stdin.readline()  # the parent starts every process at once
        stop = time.monotonic() + seconds

        def loop() -> None:
            while time.monotonic() < stop:
                outcome = _increment(s)
                with lock:
                    counts[outcome] += 1

        workers = [threading.Thread(target=loop) for _ in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    print(json.dumps(dict(counts)), flush=True)


def _increment(session: consensus_api.Session) -> str:
    """One compare-and-set increment: ``acked``, ``conflict``, ``not_applied`` or ``unknown``."""
    try:
        current = session.storage.fetch(KEY)
        if current is None:
            return "unknown"
        session.storage.update(KEY, str(int(current.value) + 1).encode(), version=current.version)
    except VersionConflictError:
        return "conflict"
    except OperationTimeoutError as exc:
        return "not_applied" if exc.not_applied else "unknown"
    except consensus_api.ConsensusError:
        return "other_error"
    return "acked"


def run(
    url: str, processes: int, threads: int, seconds: float, timeouts: tuple[float, float]
) -> dict[str, Any]:
    """Start the children, release them together, gather their counts and check the counter."""
    session_timeout, request_timeout = timeouts
    with consensus_api.connect(url) as session:
        found = session.storage.fetch(KEY)
        if found is None:
            session.storage.put(KEY, b"0")
            start_value = 0
        else:
            start_value = int(found.value)
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, URL_VARIABLE: url, "PYTHONPATH": path}
    command = [sys.executable, "-m", "benchmarks.write_load", "--child", str(seconds), str(threads)]
    command += [str(session_timeout), str(request_timeout)]
    children = [
        subprocess.Popen(command, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for _ in range(processes)
    ]
    try:
        for child in children:
            assert child.stdout is not None and child.stdout.readline().strip() == "READY"
        started = time.monotonic()
        for child in children:
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        totals: collections.Counter[str] = collections.Counter()
        for child in children:
            out, _ = child.communicate(timeout=seconds + 60)
            totals.update(json.loads(out.strip().splitlines()[-1]))
        elapsed = time.monotonic() - started
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
    with consensus_api.connect(url) as session:
        final = session.storage.fetch(KEY)
    assert final is not None
    increments = int(final.value) - start_value
    return {
        "backend": config.parse_url(url)[0].scheme.partition("+")[0],
        "processes": processes,
        "threads": threads,
        "seconds": round(elapsed, 1),
        "session_timeout": session_timeout,
        "request_timeout": request_timeout,
        "acked": totals["acked"],
        "stored_increments": increments,
        "exact": increments == totals["acked"],
        "writes_per_s": round(totals["acked"] / elapsed, 1),
        "conflicts": totals["conflict"],
        "not_applied": totals["not_applied"],
        "unknown": totals["unknown"],
        "other_errors": totals["other_error"],
        "suspended": totals["suspended"],
        "lost": totals["lost"],
    }


def main() -> None:
    """Parse the arguments; run the workload (or, with ``--child``, one process of it)."""
    if sys.argv[1:2] == ["--child"]:
        seconds, threads, session_timeout, request_timeout = sys.argv[2:6]
        _child(float(seconds), int(threads), float(session_timeout), float(request_timeout))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--session-timeout", type=float, default=3.0)
    parser.add_argument("--request-timeout", type=float, default=2.0)
    parser.add_argument("--output", type=Path, help="default: benchmarks/results/write-load-<backend>.json")
    args = parser.parse_args()
    timeouts = (args.session_timeout, args.request_timeout)
    result = run(args.url, args.processes, args.threads, args.seconds, timeouts)
    result["run"] = uuid.uuid4().hex[:8]
    print(json.dumps(result, indent=2))
    out = args.output or ROOT / "benchmarks" / "results" / f"write-load-{result['backend']}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
