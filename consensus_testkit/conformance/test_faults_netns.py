"""Faults, continued: a client process cut off by the kernel, in a Linux network namespace.

The client runs inside a network namespace whose only link to the host
(``consensus_testkit.netns``) goes down for the fault: no proxy decides
what the client sees, the kernel drops every packet, connections stay open and
silent, TCP retransmits until the link is back. Applies where the suite
controls the server; where the machine does not allow network namespaces
(root, iproute2) it fails with the reason (SQLite's profile declares it not
applicable). Bounds and recording as in ``test_faults.py``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from consensus_api import Leadership, Versioned
from consensus_testkit.conformance.faults_support import (
    CALL_LIMIT,
    FAULT_OPTIONS,
    SESSION_TIMEOUT,
    Record,
    fenced_lines,
    leading_child,
    loss_bound,
    watch_child,
)
from consensus_testkit.conformance.helpers import SessionFactory, unique
from consensus_testkit.conformance.plugin import WorkerFactory
from consensus_testkit.conformance.worker import WorkerProcess
from consensus_testkit.netns import NetworkNamespace
from consensus_testkit.proxy import HOST, url_at

if TYPE_CHECKING:
    from consensus_testkit import ServerHandle

pytestmark = [pytest.mark.requires_server, pytest.mark.network_namespace]


@pytest.fixture
def netns(consensus_server: ServerHandle) -> Iterator[NetworkNamespace]:
    """A network namespace whose 127.0.0.1, at the port clients use, leads to the tested server across
    a link that can be cut."""
    with NetworkNamespace() as opened:
        for listen, target in consensus_server.fronts:  # a cluster: each node a client is sent on to
            opened.forward(listen or consensus_server.port, target)
        yield opened


@pytest.fixture
def spawn_inside(
    netns: NetworkNamespace,
    consensus_server: ServerHandle,
    consensus_url: str,
    consensus_options: dict[str, object],
) -> Iterator[WorkerFactory]:
    """``spawn_inside(command, *args, **options)``: a worker process in ``netns``; killed at teardown."""
    url = url_at(consensus_url, HOST, consensus_server.proxy_port or consensus_server.port)
    workers: list[WorkerProcess] = []

    def factory(command: str, *args: str, **options: object) -> WorkerProcess:
        options = {**consensus_options, **options}
        workers.append(WorkerProcess(url, command, args, options, launcher=netns.prefix))
        return workers[-1]

    yield factory
    for worker in workers:
        worker.close()


def test_client_process_partitioned_by_the_network(
    netns: NetworkNamespace,
    spawn_inside: WorkerFactory,
    consensus_open_session: SessionFactory,
    consensus_ns: str,
    consensus_record: Record,
) -> None:
    """A client process that leads and is a member, cut off by the network (its namespace's link down)
    for longer than its session timeout while the server keeps running: a session that never joined
    sees the member gone and the other candidate lead with a higher term within session_timeout plus
    the backend's detection delay; the cut-off client learns it on its own before the partition heals
    (session LOST, a LeaderChanged away from itself); none of its calls during the cut blocks longer
    than request_timeout + 1 s; healed, it is CONNECTED again and re-joins its member, its stale fenced
    writes fail with FencedError and nothing the new leader wrote is overwritten."""
    group, service = unique("ct-group"), unique("ct-service")
    other = consensus_open_session(**FAULT_OPTIONS)
    child, term = leading_child(spawn_inside, group, "cut", service)
    assert other.election(service).nominate("c-other") is False
    members, leaders = watch_child(other, group, service, "cut")
    bound = loss_bound(other, SESSION_TIMEOUT)
    owned, fresh = f"{consensus_ns}/owned", f"{consensus_ns}/fresh"
    mark = len(child.lines)
    child.send(f"PROBE_START {consensus_ns}/child")

    cut = time.monotonic()
    child.send("PROBE_FAULT begins")
    netns.cut()
    try:
        members.wait_last(lambda event: "cut" not in event.members, bound, what="the cut-off member gone")
        consensus_record("cut -> member gone for others", time.monotonic() - cut)
        left = max(0.1, cut + bound - time.monotonic())
        moved = leaders.wait_for(lambda event: event.leader_id == "c-other", left, what="the new leader")
        consensus_record("cut -> new leader", time.monotonic() - cut)
        assert moved.term is not None and moved.term > term
        fence = Leadership(service, "c-other", moved.term)
        stored = Versioned(b"new leader", other.storage.put(owned, b"new leader", fence=fence))
        lost, _ = child.expect("STATE LOST", bound, since=mark)
        consensus_record("cut -> cut-off client LOST", child.arrivals[lost] - cut)
        told = child.lines.wait_index(
            lambda line: line.startswith("LEADER ") and not line.startswith("LEADER c-cut "),
            bound,
            since=mark,
            what="the cut-off client told it no longer leads",
        )
        consensus_record("cut -> cut-off client told it does not lead", child.arrivals[told] - cut)
    finally:
        netns.heal()
    healed = time.monotonic()
    child.send("PROBE_FAULT ends")
    connected, _ = child.expect("STATE CONNECTED", bound, since=lost)
    consensus_record("heal -> cut-off client CONNECTED", child.arrivals[connected] - healed)
    members.wait_last(lambda event: "cut" in event.members, bound, what="the member re-joined")
    consensus_record("heal -> member back for others", time.monotonic() - healed)

    _check_calls(child, mark, bound, consensus_record)
    _check_stale_writes_fenced(child, {"update": owned, "put": fresh}, bound, consensus_record)
    assert other.storage.fetch(owned) == stored
    assert other.storage.fetch(fresh) is None


def _check_calls(child: WorkerProcess, since: int, bound: float, timings: Record) -> None:
    """Stop the child's prober (``Prober.finish``): it never raised, none of its calls blocked longer
    than request_timeout + 1 s, it was calling during the cut and every kind of call succeeded after."""
    child.send(f"PROBE_STOP {bound}")
    _, probed = child.expect("PROBED", bound + CALL_LIMIT + 5, since=since)
    assert probed.startswith("PROBED ok "), f"the cut-off client's prober: {probed}\n{child.stderr_tail()}"
    calls, longest, failures, during = probed.split()[2:]
    assert float(longest) <= CALL_LIMIT, f"a call of the cut-off client blocked {longest}s"
    timings(
        "longest call of the cut-off client",
        float(longest),
        note=f"{calls} calls, {during} during the cut; errors: {failures}",
    )


def _check_stale_writes_fenced(
    child: WorkerProcess, keys: dict[str, str], bound: float, timings: Record
) -> None:
    """The child's fenced writes (operation: key), with the leadership it held before: FencedError."""
    mark = len(child.lines)
    for operation, key in keys.items():
        child.send(f"FENCED {operation} {key}")
    for line in fenced_lines(child, len(keys), mark, bound):
        _, operation, outcome, seconds = line.split()
        assert outcome == "fenced", f"a stale leader's fenced {operation} ended {outcome}"
        assert float(seconds) <= CALL_LIMIT, f"a fenced {operation} blocked {seconds}s"
        timings(f"stale fenced {operation} -> FencedError", float(seconds))
