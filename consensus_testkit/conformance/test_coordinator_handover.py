"""Static membership (KIP-345): a second start of an instance while the first one is alive gets
nothing the first one owns before the first one stopped it.

Contract: <https://consensus-api.github.io/consensus-api/spec/#8-coordinator-kip-795--the-kafka-rebalance-protocol-as-an-api>

Three static members share six resources, each in a child process (cooperative ``ResourceHandler``
or incremental coordinator); then a second start of one instance joins while the first one runs,
or while it is paused (SIGSTOP, resumed within its session timeout). Every child reports when it
starts and stops each resource with the wall clock of this machine (:mod:`.instance_child`), and
``overlaps`` orders the reports of all of them: no resource may start in one process before
another process that owned it stopped it. The positive control pauses the first start past its
session: the store ends its session and the others take its resources while it still runs them
(the documented exception), and the same check names every one of them.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Mapping

import pytest

from consensus_api.session import Session
from consensus_testkit.conformance.faults_support import Record
from consensus_testkit.conformance.helpers import (
    SessionFactory,
    loss_timeout,
    stays_quiet,
    unique,
    wait_until,
)
from consensus_testkit.conformance.instance_child import MODES, RESOURCES, InstanceChild
from consensus_testkit.conformance.test_coordinator import REBALANCE, SETTLE

#: The first start's pause, as a share of the session timeout: well within it (its session lives).
PAUSE_SHARE = 0.4
#: Seconds a write of the test's own session may take while the first start is paused, before the
#: pause is taken for one inside a write (see ``_pause_outside_a_write``).
PROMPT_WRITE = 1.0


def overlaps(children: Mapping[str, InstanceChild]) -> list[str]:
    """Every start of a resource in one child while another child still owned it, by the children's
    wall clocks (a stop and a start at the same microsecond count as ordered)."""
    events = sorted(
        (at, kind == "ASSIGNED", name, resource)
        for name, child in children.items()
        for kind, at, resources in child.reports()
        for resource in resources
    )
    owner: dict[str, tuple[str, float]] = {}
    found: list[str] = []
    for at, started, name, resource in events:
        held = owner.get(resource)
        if not started:
            if held is not None and held[0] == name:
                del owner[resource]
            continue
        if held is not None and held[0] != name:
            stopped = next(
                (t for k, t, r in children[held[0]].reports() if k == "REVOKED" and t > at and resource in r),
                None,
            )
            late = "never" if stopped is None else f"{stopped - at:.4f}s later"
            since = f"{held[0]} owned it since {held[1]:.6f}"
            found.append(f"{name} started {resource} at {at:.6f}; {since}, stopped {late}")
        owner[resource] = (name, at)
    return found


def handover_gap(children: Mapping[str, InstanceChild], first: str, since: float) -> float | None:
    """The shortest time from ``first`` stopping one of its resources to another child starting it,
    both after ``since`` (wall clock; negative: started before it stopped); None if none moved."""
    stops = {
        r: t
        for kind, t, resources in children[first].reports()
        if kind == "REVOKED" and t >= since
        for r in resources
    }
    gaps = [
        at - stops[resource]
        for name, child in children.items()
        if name != first
        for kind, at, resources in child.reports()
        if kind == "ASSIGNED" and at >= since
        for resource in resources & stops.keys()
    ]
    return min(gaps, default=None)


def _shared(children: Mapping[str, InstanceChild], names: list[str]) -> bool:
    """Every resource owned by exactly one of ``names``, two each."""
    held = [children[name].owned() for name in names]
    return (
        sum(map(len, held)) == len(RESOURCES)
        and frozenset().union(*held) == RESOURCES
        and all(len(h) == 2 for h in held)
    )


def _wait_shared(children: Mapping[str, InstanceChild], names: list[str], bound: float) -> None:
    wait_until(
        lambda: _shared(children, names),
        bound,
        what=f"{', '.join(names)} share the resources",
        observe=lambda: {name: sorted(child.owned()) for name, child in children.items()},
    )


@contextlib.contextmanager
def _group(url: str, options: dict[str, object], mode: str) -> Iterator[dict[str, InstanceChild]]:
    """Members ``b``, ``c`` and ``a1`` (instances ``inst-b``, ``inst-c``, ``inst-a``) of a new group, in
    that order (so ``a1`` does not run the group's arbiter or steward), sharing the resources."""
    group = unique("ct-handover")
    child_options = {**options, "mode": mode, "rebalance_timeout": REBALANCE}
    children: dict[str, InstanceChild] = {}

    def start(name: str, instance: str) -> InstanceChild:
        children[name] = child = InstanceChild(url, group, instance, child_options, name=f"member {name}")
        child.expect("CONNECTED", SETTLE)
        return child

    try:
        for name in ("b", "c", "a1"):
            start(name, f"inst-{name[0]}").send("JOIN")
            children[name].expect("READY", SETTLE)
        _wait_shared(children, ["b", "c", "a1"], SETTLE)
        start("a2", "inst-a")
        yield children
    finally:
        for child in children.values():
            child.resume()
            child.close()


def _write(session: Session, written: threading.Event) -> None:
    session.storage.put(unique("ct-handover-probe"), b"")
    written.set()


def _pause_outside_a_write(child: InstanceChild, session: Session) -> float:
    """SIGSTOP ``child`` at a moment it is not inside a write: a write of ``session`` completes
    promptly meanwhile. (A SQLite process stopped inside a write holds the file's write lock, and
    every writer waits for it; elsewhere the first try succeeds.) A try that lands inside a write
    resumes the child, lets the write end and pauses it again. Returns when the pause began
    (``time.monotonic()``)."""
    for _ in range(5):
        paused = time.monotonic()
        child.pause()
        written = threading.Event()
        threading.Thread(target=_write, args=(session, written), daemon=True).start()
        if written.wait(PROMPT_WRITE):
            return paused
        child.resume()
        written.wait(SETTLE)
    raise AssertionError(f"every pause of {child.name} stalled the writes of others")


def _settled(children: Mapping[str, InstanceChild], since: float, record: Record) -> None:
    """a1 fenced, owning nothing; b, c and a2 share the resources; nothing started before its previous
    owner stopped it. Records the closest handover from a1 (``handover_gap``)."""
    children["a1"].expect("FENCED", SETTLE)
    _wait_shared(children, ["b", "c", "a2"], SETTLE)
    assert children["a1"].owned() == frozenset()
    assert overlaps(children) == []
    gap = handover_gap(children, "a1", since)
    assert gap is not None, "none of a1's resources moved"
    record("a1 stops a resource -> another member starts it (closest)", gap)


@pytest.mark.parametrize("mode", MODES)
def test_duplicate_instance_starts_nothing_before_the_running_one_stopped_it(
    consensus_url: str, consensus_options: dict[str, object], consensus_record: Record, mode: str
) -> None:
    """a2 starts as inst-a while a1 runs: a1 is fenced and stops its resources, and only then does a2
    (or anyone) start them."""
    with _group(consensus_url, consensus_options, mode) as children:
        since = time.time()
        children["a2"].send("JOIN")
        _settled(children, since, consensus_record)


@pytest.mark.parametrize("mode", MODES)
def test_duplicate_instance_starts_nothing_before_the_paused_one_stopped_it(
    consensus_open_session: SessionFactory,
    consensus_url: str,
    consensus_options: dict[str, object],
    consensus_record: Record,
    mode: str,
) -> None:
    """a2 starts as inst-a while a1 is paused (for less than its session timeout): a2 gets nothing
    while a1 is paused; resumed, a1 is fenced and stops its resources, and only then are they
    started again."""
    pause = PAUSE_SHARE * float(str(consensus_options.get("session_timeout", 10)))
    with _group(consensus_url, consensus_options, mode) as children:
        first, second = children["a1"], children["a2"]
        paused = _pause_outside_a_write(first, consensus_open_session())
        since = time.time()
        try:
            second.send("JOIN")
            left = paused + pause - time.monotonic()
            stays_quiet(second.owned, left, what="a2 started resources while a1 was paused")
        finally:
            first.resume()
        _settled(children, since, consensus_record)


def test_duplicate_check_sees_a_first_start_that_outlived_its_session(
    consensus_open_session: SessionFactory,
    consensus_url: str,
    consensus_options: dict[str, object],
    consensus_record: Record,
) -> None:
    """The positive control: a1 is paused past its session timeout, so the store ends its session and
    its resources move while a1 still runs them (allowed: a member that outlives its session). The
    check of the other tests names every resource a1 held, started before a1 stopped it."""
    bound = loss_timeout(float(str(consensus_options.get("session_timeout", 10)))) + SETTLE
    with _group(consensus_url, consensus_options, MODES[0]) as children:
        first = children["a1"]
        held = first.owned()
        _pause_outside_a_write(first, consensus_open_session())
        since = time.time()
        try:
            children["a2"].send("JOIN")
            _wait_shared(children, ["b", "c", "a2"], bound)
        finally:
            first.resume()
        wait_until(lambda: first.owned() == frozenset(), SETTLE, what="a1 stops its resources once resumed")
        found = overlaps(children)
        assert {problem.split()[2] for problem in found} == held, found
        assert all("; a1 owned it since" in problem for problem in found), found
        gap = handover_gap(children, "a1", since)
        assert gap is not None and gap < 0, gap
        consensus_record(
            "a1 past its session: another member starts a1's resource (before a1 stopped it)", gap
        )
