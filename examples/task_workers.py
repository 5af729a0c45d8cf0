"""Tasks spread across worker processes, the way Kafka Connect does it.

    python examples/task_workers.py URL                    # demo: 3 workers, a 4th joins, one is killed
    python examples/task_workers.py URL --mode incremental # the same without a group-wide barrier
    python examples/task_workers.py URL --worker w1        # one worker, until Ctrl-C (run several)

Twelve tasks are shared by the workers of the group ``task-workers``. A
worker runs a task between ``on_assigned`` and ``on_revoked``. Modes:

* ``cooperative`` (default): a ``ResourceHandler`` with the
  ``cooperative-sticky`` assignor (KIP-429): on a rebalance a worker keeps
  what stays, revokes only what moves; the moved tasks start on their new
  worker in the follow-up round.
* ``eager``: the ``sticky`` assignor on the classic protocol: every worker
  stops everything at each rebalance.
* ``incremental``: ``session.incremental_coordinator`` (KIP-848): each worker
  reconciles on its own, no barrier; workers whose tasks do not change are
  not disturbed at all.

In every mode a task never runs on two workers at once. The demo checks that
from the workers' own reports.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time

import consensus_api as ca

GROUP = "task-workers"
TASKS = [f"task-{index:02d}" for index in range(12)]


class Worker:
    """Runs the tasks it owns; reports every start and stop on stdout."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.running: set[str] = set()

    def on_assigned(self, resources: frozenset[str]) -> None:
        self.running |= resources
        report(self.name, "START", resources)

    def on_revoked(self, resources: frozenset[str]) -> None:
        self.running -= resources  # a real worker stops the tasks here, before returning
        report(self.name, "STOP", resources)


def report(name: str, kind: str, tasks: frozenset[str]) -> None:
    print(f"{time.monotonic():.3f} {name} {kind} {' '.join(sorted(tasks))}", flush=True)


def run_worker(url: str, name: str, mode: str, duration: float) -> int:
    """One worker: join the group and run what it is given until ``duration`` ends."""
    worker = Worker(name)
    with ca.connect(url, session_timeout=3) as session:
        coordinator: ca.Coordinator | ca.IncrementalCoordinator
        if mode == "incremental":
            coordinator = session.incremental_coordinator(GROUP, TASKS, worker, rebalance_timeout=10)
        else:
            assignor = "cooperative-sticky" if mode == "cooperative" else "sticky"
            handler = ca.ResourceHandler(TASKS, worker, assignors=[assignor])
            coordinator = handler.join(session, GROUP, rebalance_timeout=10)
        coordinator.ensure_active_group(60)
        time.sleep(duration)
    return 0


class Demo:
    """Worker processes and what they report: who runs which task."""

    def __init__(self, url: str, mode: str) -> None:
        self.url, self.mode = url, mode
        self.procs: dict[str, subprocess.Popen[str]] = {}
        self.lock = threading.Lock()
        self.running: dict[str, set[str]] = {}
        self.overlaps: list[str] = []
        self.stops: dict[str, int] = {}

    def spawn(self, name: str) -> None:
        command = [sys.executable, __file__, "-", "--worker", name, "--mode", self.mode, "--duration", "90"]
        env = {**os.environ, "CONSENSUS_URL": self.url}
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
        self.procs[name] = proc
        with self.lock:
            self.running[name] = set()
        threading.Thread(target=self._read, args=(proc,), daemon=True).start()

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            _, name, kind, *tasks = line.split()
            with self.lock:
                if kind == "START":
                    for task in tasks:
                        owners = [w for w, held in self.running.items() if task in held and w != name]
                        if owners:
                            self.overlaps.append(f"{task} started on {name} while on {owners}")
                    self.running[name] |= set(tasks)
                else:
                    self.running[name] -= set(tasks)
                    self.stops[name] = self.stops.get(name, 0) + 1
            print(f"  {name}: {kind.lower()} {' '.join(tasks)}", flush=True)

    def kill(self, name: str) -> None:
        self.procs[name].send_signal(signal.SIGKILL)
        self.procs[name].wait(10)
        with self.lock:
            self.running.pop(name)  # a killed worker runs nothing

    def settle(self, timeout: float = 60) -> None:
        """Wait until every task runs on exactly one live worker, evenly spread."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                counts = [len(held) for held in self.running.values()]
                union = set().union(*self.running.values())
            if sum(counts) == len(TASKS) and union == set(TASKS) and max(counts) - min(counts) <= 1:
                return
            time.sleep(0.1)
        raise SystemExit(f"the tasks did not settle within {timeout:.0f}s: {self.running}")

    def show(self, title: str) -> None:
        with self.lock:
            print(f"== {title}")
            for name, held in sorted(self.running.items()):
                print(f"   {name}: {' '.join(sorted(held))}")

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            proc.wait(15)


def run_demo(url: str, mode: str) -> int:
    demo = Demo(url, mode)
    try:
        for name in ("w1", "w2", "w3"):
            demo.spawn(name)
        demo.settle()
        demo.show(f"3 workers ({mode})")
        with demo.lock:
            demo.stops.clear()
        demo.spawn("w4")
        demo.settle()
        demo.show(f"w4 joined; workers that stopped a task: {sorted(demo.stops) or 'none'}")
        victim = max(sorted(demo.running), key=lambda name: len(demo.running[name]))
        demo.kill(victim)
        demo.settle()
        demo.show(f"{victim} was killed; its tasks moved on")
    finally:
        demo.stop()
    if demo.overlaps:
        print("a task ran on two workers at once:", *demo.overlaps, sep="\n  ")
        return 1
    print("no task ever ran on two workers at once")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", help="backend URL ('-' for $CONSENSUS_URL)")
    parser.add_argument("--mode", choices=("cooperative", "eager", "incremental"), default="cooperative")
    parser.add_argument("--worker", help="run one worker with this name instead of the demo")
    parser.add_argument("--duration", type=float, default=3600.0, help="seconds a worker runs")
    args = parser.parse_args()
    url = os.environ["CONSENSUS_URL"] if args.url == "-" else args.url
    if args.worker:
        return run_worker(url, args.worker, args.mode, args.duration)
    return run_demo(url, args.mode)


if __name__ == "__main__":
    sys.exit(main())
