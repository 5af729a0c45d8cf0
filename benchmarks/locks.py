"""Lock acquire/release latency and hand-over from a SIGKILLed holder: ours, tooz, raw kazoo.

    consensus servers run zookeeper -- .venv/bin/python benchmarks/locks.py '$CONSENSUS_URL'

Uncontended acquire + release, ``--rounds`` times each, interleaved so that
load drifts hit every contender alike: ``session.lock`` (ours), our tooz
driver (``consensus+<URL>``), and on ZooKeeper tooz's own ZooKeeper driver and
a raw kazoo ``Lock``. Then ``--kills`` times: a child process holds the lock
(session_timeout 3 s), a waiter queues, the child is SIGKILLed, and the time
until the waiter holds it is measured (ours; on ZooKeeper also raw kazoo with
a 3 s session). Prints a table and writes ``benchmarks/results/locks-<backend>.json``.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient
from tooz import coordination

import consensus_api
from benchmarks.core import percentile
from consensus_api import config
from consensus_testkit.conformance.lock_worker import LockWorker

SESSION_TIMEOUT = 3.0
_KAZOO_HOLDER = """
import sys, time
from kazoo.client import KazooClient
client = KazooClient(hosts=sys.argv[1], timeout=3.0)
client.start(10)
client.Lock(sys.argv[2]).acquire(timeout=10)
print("HELD", flush=True)
time.sleep(120)
"""


def _contenders(url: str, name: str) -> dict[str, Callable[[], None]]:
    """What is timed: one acquire + release per call, per contender available on this backend."""
    session = consensus_api.connect(url)
    ours = session.lock(f"bench/{name}")

    def ours_round() -> None:
        ours.acquire()
        ours.release()

    ours_tooz = coordination.get_coordinator(f"consensus+{url}", b"bench")
    ours_tooz.start(start_heart=True)
    tooz_lock = ours_tooz.get_lock(f"bench-{name}".encode())

    def tooz_round(lock: Any = tooz_lock) -> None:
        lock.acquire()
        lock.release()

    contenders = {"ours": ours_round, "tooz driver on ours": tooz_round}
    parsed, _ = config.parse_url(url)
    if parsed.scheme in ("zookeeper", "zk"):
        hosts = ",".join(f"{e.host}:{e.port or 2181}" for e in parsed.endpoints)
        zk_tooz = coordination.get_coordinator(f"zookeeper://{hosts}", b"bench-zk")
        zk_tooz.start(start_heart=True)
        zk_lock = zk_tooz.get_lock(f"bench-{name}".encode())
        contenders["tooz zookeeper driver"] = lambda: tooz_round(zk_lock)
        client = KazooClient(hosts=hosts)
        client.start(10)
        kazoo_lock = client.Lock(f"/bench-locks/{name}")

        def kazoo_round() -> None:
            kazoo_lock.acquire(timeout=10)
            kazoo_lock.release()

        contenders["raw kazoo Lock"] = kazoo_round
    return contenders


def latency(url: str, rounds: int) -> dict[str, dict[str, float]]:
    """p50/p99 milliseconds of acquire + release per contender, interleaved."""
    contenders = _contenders(url, uuid.uuid4().hex)
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, call in contenders.items():
            start = time.perf_counter()
            call()
            times[name].append((time.perf_counter() - start) * 1000)
    return {name: {"p50_ms": percentile(v, 50), "p99_ms": percentile(v, 99)} for name, v in times.items()}


def _handover_ours(url: str) -> float:
    name = f"bench/{uuid.uuid4().hex}"
    holder = LockWorker(url, ["hold", name], {"session_timeout": SESSION_TIMEOUT})
    try:
        holder.expect("HELD", 60)
        with consensus_api.connect(url, session_timeout=SESSION_TIMEOUT) as session:
            lock = session.lock(name)
            assert lock.acquire(timeout=0.2) is None
            killed = time.monotonic()
            holder.signal(signal.SIGKILL)
            assert lock.acquire(timeout=60) is not None
            return time.monotonic() - killed
    finally:
        holder.close()


def _handover_kazoo(hosts: str) -> float:
    path = f"/bench-locks/{uuid.uuid4().hex}"
    holder = subprocess.Popen(
        [sys.executable, "-c", _KAZOO_HOLDER, hosts, path], stdout=subprocess.PIPE, text=True
    )
    client = KazooClient(hosts=hosts, timeout=SESSION_TIMEOUT)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "HELD"
        client.start(10)
        killed = time.monotonic()
        holder.send_signal(signal.SIGKILL)
        assert client.Lock(path).acquire(timeout=60)
        return time.monotonic() - killed
    finally:
        holder.kill()
        holder.wait(10)
        client.stop()
        client.close()


def handover(url: str, kills: int) -> dict[str, dict[str, float]]:
    """Seconds from SIGKILL of the holder to the next waiter holding the lock (median, max)."""
    found = {"ours": [_handover_ours(url) for _ in range(kills)]}
    parsed, _ = config.parse_url(url)
    if parsed.scheme in ("zookeeper", "zk"):
        hosts = ",".join(f"{e.host}:{e.port or 2181}" for e in parsed.endpoints)
        found["raw kazoo Lock"] = [_handover_kazoo(hosts) for _ in range(kills)]
    return {name: {"median_s": percentile(v, 50), "max_s": max(v)} for name, v in found.items()}


def main() -> None:
    """Run both measures on the backend at URL and print/write them."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--kills", type=int, default=3)
    args = parser.parse_args()
    backend = config.parse_url(args.url)[0].scheme.split("+")[0]
    measured = latency(args.url, args.rounds)
    handed = handover(args.url, args.kills)
    for name, row in measured.items():
        print(
            f"{backend:10} acquire+release {name:22} p50 {row['p50_ms']:7.2f} ms  p99 {row['p99_ms']:7.2f} ms"
        )
    for name, row in handed.items():
        print(
            f"{backend:10} kill hand-over {name:23} median {row['median_s']:.2f} s max {row['max_s']:.2f} s"
        )
    result = {"backend": backend, "latency": measured, "handover": handed}
    out = Path(__file__).parent / "results" / f"locks-{backend}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
