"""Leader failover: SIGKILL of the leading process, then the next leader's callback.

Each trial: a child process (``benchmarks.child candidate``) becomes leader
with session timeout T; a second child queues up behind it; the leader is
SIGKILLed (no goodbye: the server must time its session out) and the latency
runs to the follower's "you lead" callback (``time.monotonic``, one clock for
all processes). Kinds: ours (a leader listener), tooz where it can elect
(ZooKeeper: ``watch_elected_as_leader`` with ``run_watchers`` every 10 ms)
and a raw kazoo ``Election`` on ZooKeeper. Every candidate has a process of
its own. Trials run in waves of up to ``WAVE`` trials of one kind at once
(tooz's candidates poll the server every 10 ms, which would slow the other
kinds down), the kinds' waves alternating. Every client renews its session
on a cycle of about T/3 (pings, keep-alives, lease renewals, heartbeats) and
servers check expiry on ticks of their own, so failover times depend on
phases: each follower starts after a random delay within T/3, and each kill
comes at a random moment within max(``SPREAD``, T/3) after all are in line,
so that the trials sample those phases instead of the start-up rhythm of
the benchmark. On SQL each trial has tables of its own (see ``_isolated``).
On ZooKeeper a watcher in this process also records when the
leader's znode vanished, which splits each failover into the session expiry
and the handoff after it.
Target: p99 <= T + 0.5 s on every backend; where tooz elects, a handoff
faster than tooz's.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

from kazoo.client import KazooClient

from benchmarks import tooz_baseline
from benchmarks.core import Plan, Row, Stamp, ms, ratio, within
from benchmarks.procs import Child
from benchmarks.raw import zk_hosts
from consensus_api import config
from consensus_backends.zookeeper.layout import Layout, chroot_of

WAVE = 4
SPREAD = 1.0
MARGIN = 0.5
#: tooz on ZooKeeper, measured on a 2-core machine (docs/performance.md): timeout -> (p50, p99) seconds.
TOOZ_REFERENCE = {1.0: (1.09, 1.46), 10.0: (9.1, 10.4)}


@dataclass
class _Trial:
    kind: str
    name: str
    leader: Child
    follower: Child | None = None
    expired: Stamp | None = None
    killed_at: float | None = None

    def close(self) -> None:
        self.leader.close(2.0)
        if self.follower is not None:
            self.follower.close(2.0)


class _Expiry:
    """ZooKeeper only: when each leader's znode vanished (its session expired), seen by a third client."""

    def __init__(self, hosts: str) -> None:
        self.client = KazooClient(hosts=hosts, timeout=10)
        self.client.start(timeout=10)

    def watch(self, parent: str) -> Stamp:
        """A stamp set when the lowest-sequence child of ``parent`` (the leader's znode) is deleted."""
        stamp = Stamp()
        leader = min(self.client.get_children(parent), key=lambda name: name[-10:])
        if self.client.exists(f"{parent}/{leader}", watch=lambda event: stamp.set()) is None:
            raise RuntimeError(f"the leader's znode below {parent} vanished before the kill")
        return stamp

    def close(self) -> None:
        self.client.stop()
        self.client.close()


def _isolated(url: str, trial: str) -> str:
    """``url`` with tables of the trial's own on SQL: there every session reaps every expired lease
    at its heartbeats, so trials sharing tables would detect each other's dead leaders early."""
    if not url.startswith(("sqlite", "postgresql")):
        return url
    prefix = "fo" + "".join(char for char in trial if char.isalnum())[-24:] + "_"
    return f"{url}{'&' if '?' in url else '?'}table_prefix={prefix}"


def _leader_parent(trial: _Trial, url: config.BackendURL) -> str:
    """The znode whose children are the candidates of ``trial``'s election."""
    if trial.kind == "ours":
        return Layout(chroot_of(url.path)).queue(trial.name)
    if trial.kind == "tooz":
        return f"/tooz/{trial.name}/leader"
    return trial.name


Times = dict[str, list[float]]


def _wave(url: str, kinds: list[str], timeout: float, prefix: str) -> tuple[Times, Times]:
    """Kill → new leader, and (ZooKeeper) leader znode gone → new leader, per kind."""
    parsed, _ = config.parse_url(url)
    toozurl = tooz_baseline.tooz_url(url, "election", timeout) or ""
    zookeeper = parsed.scheme in ("zookeeper", "zk")
    hosts = zk_hosts(parsed) if zookeeper else ""
    trials: list[_Trial] = []
    results: Times = {kind: [] for kind in kinds}
    handoffs: Times = {kind: [] for kind in kinds}
    expiry = _Expiry(hosts) if zookeeper else None
    try:
        for index, kind in enumerate(kinds):
            name = f"{prefix}-{index}-{kind}"
            if kind == "kazoo":
                name = f"{parsed.path.rstrip('/')}/rawbench-elections/{name}"
            target = {"ours": _isolated(url, f"{prefix}-{index}"), "tooz": toozurl, "kazoo": hosts}[kind]
            args = ("candidate", kind, target, name, f"{timeout:g}")
            trials.append(_Trial(kind, name, Child(*args, "leader")))
        for trial in trials:
            trial.leader.expect("LEADS", 60)
        phase = max(SPREAD, timeout / 3)
        begin = time.monotonic()
        for at, trial in sorted(((random.uniform(0, phase), t) for t in trials), key=lambda p: p[0]):
            time.sleep(max(0.0, begin + at - time.monotonic()))
            trial.follower = Child("candidate", *trial.leader.args[1:5], "follower")
        for trial in trials:
            assert trial.follower is not None
            trial.follower.expect("QUEUED", 60)
            if expiry is not None:
                trial.expired = expiry.watch(_leader_parent(trial, parsed))
        start = time.monotonic()
        schedule = sorted(((start + random.uniform(0, phase), trial) for trial in trials), key=lambda p: p[0])
        for at, trial in schedule:
            time.sleep(max(0.0, at - time.monotonic()))
            trial.killed_at = trial.leader.kill()
        for trial in trials:
            assert trial.follower is not None and trial.killed_at is not None
            bound = max(1.0, start + phase + 3 * timeout + 10 - time.monotonic())
            seen = float(trial.follower.expect("LEADS", bound)[0])
            results[trial.kind].append(seen - trial.killed_at)
            gone = trial.expired.wait(0) if trial.expired is not None else None
            if gone is not None:
                handoffs[trial.kind].append(seen - gone)
    finally:
        for trial in trials:
            trial.close()
        if expiry is not None:
            expiry.close()
    return results, handoffs


def run(url: str, backend: str, plan: Plan, run_id: str) -> list[Row]:
    """Rows ``failover.<T>s`` (ours vs tooz, or ours alone) and ``failover.<T>s.kazoo`` on ZooKeeper."""
    kinds = ["ours"]
    if tooz_baseline.tooz_url(url, "election") is not None:
        kinds.append("tooz")
    if backend == "zookeeper":
        kinds.append("kazoo")
    rows = []
    for timeout, reps in plan.failover_reps.items():
        times: Times = {kind: [] for kind in kinds}
        handoffs: Times = {kind: [] for kind in kinds}
        waves = [[kind] * min(WAVE, reps - done) for done in range(0, reps, WAVE) for kind in kinds]
        for wave, trials in enumerate(waves):
            found, after = _wave(url, trials, timeout, f"bench-{run_id}-fo{timeout:g}-w{wave}")
            for kind in kinds:
                times[kind].extend(found.get(kind, []))
                handoffs[kind].extend(after.get(kind, []))
        rows.extend(_rows(timeout, times, handoffs, url))
    return rows


def _rows(timeout: float, times: Times, handoffs: Times, url: str) -> list[Row]:
    """``failover.<T>s``: ours against tooz (or the bound alone); ``.kazoo``: against a raw kazoo Election.

    Where tooz elects (ZooKeeper) "faster" is judged on the handoff, from the
    leader's znode vanishing to the callback: the kill-to-callback times of
    both are dominated by where in its ping cycle and in the server's expiry
    tick each killed session was, which a few trials cannot average out.
    """
    ours = times["ours"]
    ours_p50, ours_p99 = ms(ours, 50), ms(ours, 99)
    bound = within(ours_p99, (timeout + MARGIN) * 1000)
    extra: dict[str, object] = {"samples": len(ours), "session_timeout_s": timeout}
    reference = TOOZ_REFERENCE.get(timeout)
    if reference is not None:
        extra["tooz_reference_p50_ms"], extra["tooz_reference_p99_ms"] = (v * 1000 for v in reference)
    if handoffs["ours"]:
        extra["ours_handoff_p50_ms"], extra["ours_handoff_p99_ms"] = (
            ms(handoffs["ours"], 50),
            ms(handoffs["ours"], 99),
        )
    name = f"failover.{timeout:g}s"
    rows = []
    for kind, label in (("tooz", "tooz (run_watchers every 10 ms)"), ("kazoo", "raw kazoo Election")):
        if kind not in times:
            continue
        other = times[kind]
        row_extra = dict(extra)
        faster: bool | None = None
        if handoffs[kind]:
            theirs = ms(handoffs[kind], 50), ms(handoffs[kind], 99)
            row_extra["baseline_handoff_p50_ms"], row_extra["baseline_handoff_p99_ms"] = theirs
            ours_handoff = row_extra.get("ours_handoff_p50_ms")
            faster = isinstance(ours_handoff, float) and theirs[0] is not None and ours_handoff < theirs[0]
        tooz = kind == "tooz"
        rows.append(
            Row(
                name if tooz else f"{name}.kazoo",
                ours_p50,
                ours_p99,
                label,
                ms(other, 50),
                ms(other, 99),
                ratio(ours_p99, ms(other, 99)),
                f"p99 <= {timeout + MARGIN:g} s and handoff p50 < tooz's" if tooz else None,
                bool(bound and faster) if tooz else None,
                note=None if tooz else "reference only: both wait for the same ZooKeeper session expiry",
                extra=row_extra,
            )
        )
    if "tooz" not in times:
        note = tooz_baseline.missing(url, "election")
        rows.insert(
            0,
            Row(
                name,
                ours_p50,
                ours_p99,
                target=f"p99 <= {timeout + MARGIN:g} s",
                holds=bound,
                note=note,
                extra=extra,
            ),
        )
    return rows
