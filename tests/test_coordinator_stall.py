"""The generic coordinators' deadlines when the store stalls (real servers, SIGSTOP).

A group's arbiter leaves out a member that has not joined within
``rebalance_timeout``, and an incremental group's steward fences a member that
has not acknowledged a revocation within it. When the server is frozen, nobody
can answer; a member left out or fenced for that would keep what it owns while
the group hands it on, or lose everything, through no fault of its own. The
deadline must count from the moment the store serves again.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

import pytest

import consensus_api as ca
from consensus_api import OperationTimeoutError, ResourceHandler, Session, ValueChanged
from consensus_api.coordinator.generic.reconcile import UNREVOKED, GroupState
from consensus_api.coordinator.generic.records import PREPARING, GenerationRecord, IncrementalLayout, Layout
from consensus_testkit import ServerHandle, start_server
from consensus_testkit.conformance.coordination import Ledger
from consensus_testkit.conformance.helpers import wait_until

SIX = frozenset(f"r{index}" for index in range(6))
REBALANCE = 3.0
STALL = REBALANCE + 3.0
#: Long enough for every session and call to outlast the stall.
OPTIONS = {"session_timeout": 30, "request_timeout": 20}


@pytest.fixture(params=["etcd", "postgresql"])
def own_server(request: pytest.FixtureRequest) -> Iterator[ServerHandle]:
    """A server of each kind for one test that pauses it."""
    with start_server(request.param) as handle:
        yield handle


@pytest.fixture
def sessions(own_server: ServerHandle) -> Iterator[list[Session]]:
    """Four sessions on ``own_server``, closed at the end."""
    opened = [ca.connect(own_server.url, **OPTIONS) for _ in range(4)]
    yield opened
    for session in opened:
        session.close()


class _Freezer:
    """Freezes a server the first time an event meets a condition; keeps it frozen for ``STALL``."""

    def __init__(self, server: ServerHandle) -> None:
        self._server = server
        self.frozen = threading.Event()

    def on(self, condition: Callable[[ValueChanged], bool]) -> Callable[[ValueChanged], None]:
        """A value listener that freezes the server at the first event meeting ``condition``."""

        def listener(event: ValueChanged) -> None:
            if not self.frozen.is_set() and condition(event):
                self._server.pause()
                self.frozen.set()

        return listener

    def stall(self, what: str) -> None:
        """Wait until the server is frozen (``what`` names the awaited moment), then resume it after
        ``STALL`` seconds."""
        assert self.frozen.wait(30), f"{what} never came"
        time.sleep(STALL)
        self._server.resume()


@pytest.fixture
def freezer(own_server: ServerHandle, sessions: list[Session]) -> Iterator[_Freezer]:
    """A ``_Freezer`` of ``own_server``; the server is resumed before the sessions close."""
    freezing = _Freezer(own_server)
    yield freezing
    if freezing.frozen.is_set():
        own_server.resume()


class _SlowToStop:
    """Records in ``ledger`` as ``member``; takes ``delay`` seconds to stop what it is revoked."""

    def __init__(self, ledger: Ledger, member: str, delay: float) -> None:
        self._inner = ledger.listener(member)
        self._delay = delay

    def on_assigned(self, resources: frozenset[str]) -> None:
        self._inner.on_assigned(resources)

    def on_revoked(self, resources: frozenset[str]) -> None:
        if resources:
            time.sleep(self._delay)
        self._inner.on_revoked(resources)


def test_a_stall_during_a_rebalance_leaves_nobody_out(sessions: list[Session], freezer: _Freezer) -> None:
    """Eager members a and b take 0.5 s to stop their resources when c joins; the server is frozen
    for longer than rebalance_timeout the moment the arbiter announces the rebalance, so their joins
    wait for it. Resumed, the rebalance completes with all three in the generation it announced:
    nobody is passed over, and nobody ever owns more than its share of two, as a member would if
    the others had been left out."""
    group, ledger = "stall", Ledger()
    members = []
    for name, session in zip("ab", sessions, strict=False):
        handler = ResourceHandler(SIX, _SlowToStop(ledger, name, 0.5), assignors=["range"])
        members.append(handler.join(session, group, rebalance_timeout=REBALANCE))
        members[-1].ensure_active_group(30)
    wait_until(lambda: ledger.balanced(["a", "b"], SIX), 30, what="a and b share the resources")
    settled = max(member.generation().generation_id for member in members)

    def announced(event: ValueChanged) -> bool:
        record = GenerationRecord.decode(event.value) if event.value is not None else None
        return record is not None and record.state == PREPARING and record.generation > settled

    sessions[3].listeners.add_value_listener(Layout(group).record, freezer.on(announced))
    mark = ledger.mark()
    handler = ResourceHandler(SIX, _SlowToStop(ledger, "c", 0.5), assignors=["range"])
    joiner = handler.join(sessions[2], group, rebalance_timeout=REBALANCE)
    with contextlib.suppress(OperationTimeoutError):
        joiner.ensure_active_group(0.05)  # starts its join
    freezer.stall("the rebalance")
    wait_until(lambda: ledger.balanced(["a", "b", "c"], SIX), 30, what="a, b and c share the resources")
    owned: dict[str, set[str]] = {"a": set(), "b": set(), "c": set()}
    for member, kind, resources in ledger.events[mark:]:
        owned[member] = owned[member] | resources if kind == "+" else owned[member] - resources
        assert len(owned[member]) <= 2, f"{member} was given {sorted(owned[member])}: others left out"
    generations = [member.generation().generation_id for member in (*members, joiner)]
    assert generations == [settled + 1] * 3, f"{generations}: the rebalance took more than one generation"
    assert ledger.double_owned() == []


def test_a_stall_while_a_member_revokes_does_not_fence_it(sessions: list[Session], freezer: _Freezer) -> None:
    """Incremental: a owns all six and takes 0.5 s to stop what it is revoked; b joins, and the
    server is frozen for longer than rebalance_timeout the moment the steward asks a to revoke, so
    a's acknowledgement waits for it. Resumed, a is not fenced: it keeps its three throughout."""
    group, ledger = "stall-incremental", Ledger()
    a = sessions[0].incremental_coordinator(
        group, SIX, _SlowToStop(ledger, "a", 0.5), rebalance_timeout=REBALANCE
    )
    a.ensure_active_group(30)
    wait_until(lambda: ledger.snapshot()["a"] == SIX, 30, what="a owns all six")

    def revoking(event: ValueChanged) -> bool:
        state = GroupState.decode(event.value) if event.value is not None else None
        return state is not None and any(entry.state == UNREVOKED for entry in state.members.values())

    sessions[2].listeners.add_value_listener(IncrementalLayout(group).state, freezer.on(revoking))
    mark = ledger.mark()
    b = sessions[1].incremental_coordinator(
        group, SIX, _SlowToStop(ledger, "b", 0.5), rebalance_timeout=REBALANCE
    )
    with contextlib.suppress(OperationTimeoutError):
        b.ensure_active_group(0.05)  # starts its join
    freezer.stall("the revocation")
    wait_until(lambda: ledger.balanced(["a", "b"], SIX), 30, what="a and b share the resources")
    owned = set(SIX)
    for member, kind, resources in ledger.events[mark:]:
        if member == "a":
            owned = owned | resources if kind == "+" else owned - resources
            assert owned, "a was fenced: it revoked everything"
    assert ledger.double_owned() == []
