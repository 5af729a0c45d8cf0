"""A session at rest: the CPU and resident memory of a process whose one session holds one value
listener, one group membership and one candidacy, and does nothing else.

    python -m benchmarks.idle SETTLE SECONDS      (the URL in ``$CONSENSUS_URL``)

The measurement runs in a process of its own (that module run as a script), so that the CPU time
(``time.process_time()``, every thread of the process) and the resident memory (``/proc``) count
only the session: the interpreter, ``consensus_api``, the backend and its client library. It
opens the session, sets up the three holdings, waits ``SETTLE`` seconds (joins, rebalances and
the first heartbeats are done), then sleeps ``SECONDS`` and prints one JSON line: the share of
one core the process used meanwhile, in percent, and its resident memory in MiB.
Target (issue 36): at most ``CPU_TARGET_PCT`` % of a core and ``RSS_TARGET_MB`` MiB.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

from benchmarks.core import Plan, Row, rss_mb
from consensus_api import connect
from consensus_api.config import ENV_URL

CPU_TARGET_PCT = 0.2
RSS_TARGET_MB = 40.0
#: Seconds the child waits after its set-up before it measures: past the Kafka driver's
#: ``ACTIVE_WINDOW``, after which it lists its groups less often.
SETTLE_S = 12.0
#: Seconds it measures (full run, ``--quick``).
MEASURE_S = {False: 20.0, True: 10.0}


def rest(url: str, run_id: str, settle: float, seconds: float) -> dict[str, float]:
    """Open the idle session, wait ``settle``, then measure ``seconds``: ``{"cpu_pct", "rss_mb",
    "base_rss_mb"}`` (the last: before connecting, with ``consensus_api`` imported but no backend)."""
    base = rss_mb()
    name = f"bench-{run_id}-idle"
    with connect(url) as session:
        session.storage.put(f"{name}/watched", b"start")
        session.listeners.add_value_listener(f"{name}/watched", lambda event: None)
        session.group(name).join("idle")
        session.election(name).nominate("idle")
        time.sleep(settle)
        cpu, wall = time.process_time(), time.monotonic()
        time.sleep(seconds)
        used, elapsed = time.process_time() - cpu, time.monotonic() - wall
        return {
            "cpu_pct": round(100 * used / elapsed, 3),
            "rss_mb": round(rss_mb(), 1),
            "base_rss_mb": round(base, 1),
        }


def run(url: str, plan: Plan, run_id: str) -> list[Row]:
    """One row, ``idle.session``: the child's CPU and RSS against the targets."""
    settle, seconds = SETTLE_S, MEASURE_S[plan.quick]
    env = {**os.environ, ENV_URL: url}
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.idle", run_id, str(settle), str(seconds)],
        env=env,
        capture_output=True,
        text=True,
        timeout=settle + seconds + 120,
        check=False,
    )
    if done.returncode != 0:
        tail = " | ".join(done.stderr.strip().splitlines()[-3:])
        return [
            Row("idle.session", None, None, note=f"failed: the idle child exited {done.returncode}: {tail}")
        ]
    found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    holds = found["cpu_pct"] <= CPU_TARGET_PCT and found["rss_mb"] <= RSS_TARGET_MB
    return [
        Row(
            "idle.session",
            None,
            None,
            target=f"CPU <= {CPU_TARGET_PCT:g} % of a core, RSS <= {RSS_TARGET_MB:g} MiB",
            holds=holds,
            note=f"{found['cpu_pct']:.3f} % of a core, {found['rss_mb']:.1f} MiB over {seconds:g} s",
            extra={**found, "seconds": seconds},
        )
    ]


if __name__ == "__main__":
    print(json.dumps(rest(os.environ[ENV_URL], sys.argv[1], float(sys.argv[2]), float(sys.argv[3]))))
