"""The frozen-mid-transaction takeover, N runs in a row (issue 24's "must show").

Runs the conformance test ``test_leader_frozen_mid_write_is_replaced`` N times,
each in a fresh ``consensus conformance`` process, and counts: passes,
takeovers within the bound (as ``loss_bound``: session_timeout + detection delay
+ scheduling slack), and stale writes (a frozen leader's write found after the
takeover: the test's final-state assertion, or a queued fenced write that did
not fail with FencedError). Takeover time: SIGSTOP seen -> the other
candidate's LeaderChanged::

    consensus servers run postgresql -- \
        .venv/bin/python benchmarks/frozen_takeover.py '$CONSENSUS_URL' --runs 50
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from consensus_testkit.conformance.faults_support import SCHEDULING_SLACK, SESSION_TIMEOUT
from consensus_testkit.profile import profile_for

TEST = "test_leader_frozen_mid_write_is_replaced"
TAKEOVER = "frozen mid-write -> new leader"
#: What a failed run's output says when a frozen leader's write survived the takeover.
STALE_MARKS = ("changed after the takeover", "a stale leader's fenced", "is not None")
#: One run: interpreter start-up, servers' sessions, the freeze and the recovery.
RUN_TIMEOUT = 120.0


def one_run(url: str, timings: Path) -> tuple[bool, str]:
    """Run the test once; (passed, the tail of its output)."""
    command = [str(Path(sys.executable).with_name("consensus")), "conformance", "-k", TEST]
    env = {**os.environ, "CONSENSUS_TIMINGS": str(timings), "CONSENSUS_URL": url}  # not in argv: ps shows it
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT, check=False)
    return done.returncode == 0, (done.stdout + done.stderr)[-3000:]


def main() -> int:
    """Run, print a summary line per run and the totals; exit 0 if every run passed."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("url")
    parser.add_argument("--runs", type=int, default=50)
    args = parser.parse_args()
    profile = profile_for(args.url)
    bound = SESSION_TIMEOUT + profile.detection_delay(SESSION_TIMEOUT) + SCHEDULING_SLACK
    takeovers: list[float] = []
    failures: list[str] = []
    stale = 0
    with tempfile.TemporaryDirectory() as scratch:
        for run in range(1, args.runs + 1):
            timings = Path(scratch) / f"{run}.json"
            passed, output = one_run(args.url, timings)
            recorded = json.loads(timings.read_text()) if timings.exists() else []
            seconds = [t["seconds"] for t in recorded if t["measure"] == TAKEOVER]
            takeovers += seconds
            if not passed:
                failures.append(output)
                stale += any(mark in output for mark in STALE_MARKS)
            took = f"{seconds[0]:.3f} s" if seconds else "-"
            print(f"run {run:3d}: {'pass' if passed else 'FAIL'}  takeover {took}", flush=True)
    within = sum(seconds <= bound for seconds in takeovers)
    passes = args.runs - len(failures)
    print(f"{profile.name}: {args.runs} runs, {passes} passed, {within} takeovers within {bound:g} s, "
          f"{stale} runs with a stale write")  # fmt: skip
    if takeovers:
        print(f"takeover s: min {min(takeovers):.3f} median {statistics.median(takeovers):.3f} "
              f"max {max(takeovers):.3f}")  # fmt: skip
    for output in failures:
        print("---- a failed run ----\n" + output)
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())
