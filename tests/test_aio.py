"""consensus_api.aio on real backends: awaitables, event streams, cancellation, no loop blocking."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

import consensus_api as ca
from consensus_api import aio
from consensus_testkit import ServerHandle
from consensus_testkit.conformance.loop_watch import StepWatch
from consensus_testkit.conformance.test_aio import SLOW_STEP, blocked_steps

BACKENDS = ["sqlite", "postgresql", "etcd", "zookeeper"]
TIMEOUT = 20.0


@pytest.fixture(params=BACKENDS)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh target on each backend (servers start on first use)."""
    name: str = request.param
    if name == "sqlite":
        return f"sqlite:///{tmp_path / 'aio.db'}"
    if name == "postgresql":
        return str(request.getfixturevalue("postgresql_target"))
    if name == "etcd":
        return str(request.getfixturevalue("etcd_target"))
    server: ServerHandle = request.getfixturevalue("zookeeper_server")
    return f"{server.url}/t-{uuid.uuid4().hex[:8]}"


def run(main: Callable[[], Awaitable[Any]], *, debug: bool = False) -> Any:
    """Run ``main()`` in a new loop, bounded by TIMEOUT."""

    async def bounded() -> Any:
        return await asyncio.wait_for(main(), TIMEOUT)

    return asyncio.run(bounded(), debug=debug)


def test_storage_calls_match_the_sync_contract(url: str) -> None:
    async def main() -> None:
        async with aio.connect(url, session_timeout=5) as session:
            assert session.backend in url
            version = await session.storage.put("app/a", b"1")
            assert await session.storage.fetch("app/a") == ca.Versioned(b"1", version)
            with pytest.raises(ca.KeyExistsError):
                await session.storage.put("app/a", b"again")
            newer = await session.storage.update("app/a", b"2", version=version)
            with pytest.raises(ca.VersionConflictError):
                await session.storage.update("app/a", b"3", version=version)
            await session.storage.put("app/b/c", b"deep")
            assert await session.storage.keys("app") == {"app/a"}
            walked = {key: item.value async for key, item in session.storage.walk("app")}
            assert walked == {"app/a": b"2", "app/b/c": b"deep"}
            await session.storage.delete("app/a", version=newer)
            assert await session.storage.fetch("app/a") is None
            with pytest.raises(ca.InvalidKeyError):
                session.listeners.watch("/bad/")  # checked before any I/O, not awaited

    run(main)


def test_value_stream_first_event_ordered_converging_and_coalesced(url: str) -> None:
    """A consumer that sleeps while 30 writes land sees the current state first, versions that
    never go back, a bounded number of events, and last the final value."""

    async def main() -> None:
        async with aio.connect(url) as session:
            first_version = await session.storage.put("k", b"0")
            seen: list[ca.ValueChanged] = []
            async with session.listeners.watch("k") as events:
                async for event in events:
                    seen.append(event)
                    if len(seen) == 1:
                        assert event == ca.ValueChanged("k", b"0", first_version)
                        for number in range(1, 31):
                            await session.storage.update("k", str(number).encode())
                    if event.value == b"30":
                        break
            versions = [event.version for event in seen if event.version is not None]
            assert versions == sorted(set(versions)), seen
            assert len(seen) < 31, f"a slow consumer must get coalesced events, got {len(seen)}"

    run(main)


def test_group_election_and_state_streams(url: str) -> None:
    async def main() -> None:
        async with aio.connect(url) as session:
            group, election = session.group("workers"), session.election("scheduler")
            members = group.watch()
            assert (await anext(members)).members == {}
            await group.join("w1", b"data")
            assert dict((await anext(members)).members) == {"w1": b"data"}
            leaders = election.watch()
            assert await anext(leaders) == ca.LeaderChanged("scheduler", None, None)
            assert await election.nominate("w1")
            leading = await anext(leaders)
            assert leading.leader_id == "w1"
            assert await election.leadership() == ca.Leadership("scheduler", "w1", leading.term or 0)
            await election.resign("w1")
            assert (await anext(leaders)).leader_id is None
            await group.leave("w1")
            assert await group.members() == frozenset()
            states = session.states()
            assert await anext(states) is ca.SessionState.CONNECTED
        assert [state async for state in states] == [ca.SessionState.CLOSED]
        assert [event async for event in members] in ([], [ca.MembershipChanged("workers", {})])
        assert [event async for event in session.listeners.watch("late")] == []  # closed: ends at once

    run(main)


def test_the_blocking_detector_sees_a_blocking_call(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The positive control: a synchronous session used in a task is reported (with twice the
    threshold, so that the CPU wait of the process's other threads on a loaded machine, which the
    detector subtracts, cannot hide it)."""

    async def main() -> None:
        with StepWatch(SLOW_STEP).watching(asyncio.get_running_loop()):
            await asyncio.sleep(0)
            with ca.connect(f"sqlite:///{tmp_path / 'x.db'}") as session:
                session.storage.put("k", b"v")
                time.sleep(2 * SLOW_STEP)  # what a slow server does to a blocking call
            await asyncio.sleep(0)  # the step ends (and is reported) while the watch is on

    with caplog.at_level(logging.WARNING, logger="asyncio"):
        run(main, debug=True)
    assert len(blocked_steps(caplog.records)) == 1


def test_a_step_slowed_by_waiting_for_a_cpu_is_not_a_blocked_loop(caplog: pytest.LogCaptureFixture) -> None:
    """Four busy processes share this process's one CPU: a step of 0.05 s of CPU work takes several
    times as long, and the detector puts that down to the wait for the CPU, not to the loop."""
    cpu = min(os.sched_getaffinity(0))
    before = os.sched_getaffinity(0)
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(4)]
    slowest: list[float] = []

    async def main() -> None:
        with StepWatch(SLOW_STEP).watching(asyncio.get_running_loop()):
            for _ in range(5):
                await asyncio.sleep(0)
                started, cpu_started = time.monotonic(), time.thread_time()
                while time.thread_time() - cpu_started < SLOW_STEP / 2:
                    pass
                slowest.append(time.monotonic() - started)
            await asyncio.sleep(0)

    try:
        os.sched_setaffinity(0, {cpu})
        for hog in hogs:
            os.sched_setaffinity(hog.pid, {cpu})
        with caplog.at_level(logging.WARNING, logger="asyncio"):
            run(main, debug=True)
    finally:
        os.sched_setaffinity(0, before)
        for hog in hogs:
            hog.kill()
            hog.wait(TIMEOUT)
    assert max(slowest) > SLOW_STEP, slowest  # the steps were slow...
    assert blocked_steps(caplog.records) == []  # ...and not reported as blocking


def test_no_call_blocks_the_event_loop(url: str, caplog: pytest.LogCaptureFixture) -> None:
    """asyncio's debug mode reports every task step that holds the loop too long: none does."""

    async def main() -> None:
        with StepWatch(SLOW_STEP).watching(asyncio.get_running_loop()):
            await busy(url)

    async def busy(url: str) -> None:
        async with aio.connect(url) as session:
            async with session.listeners.watch("busy") as events:
                assert (await anext(events)).value is None
                for number in range(20):
                    await session.storage.put(f"busy/{number}", b"x")
                await session.storage.put("busy", b"done")
                while (await anext(events)).value != b"done":
                    pass
            await session.group("g").join("m")
            assert await session.election("e").nominate("m")
            assert len(await session.storage.keys("busy")) == 20

    with caplog.at_level(logging.WARNING, logger="asyncio"):
        run(main, debug=True)
    assert blocked_steps(caplog.records) == []


def test_async_coordinator_handler_runs_on_the_loop(url: str) -> None:
    calls: list[tuple[str, bool]] = []

    class Handler:
        def metadata(self) -> list[tuple[str, bytes]]:
            return [("range", b"")]

        async def on_join_prepare(self, generation: int, member_id: str) -> None:
            calls.append(("prepare", threading.current_thread() is threading.main_thread()))

        async def perform_assignment(
            self, leader_id: str, protocol: str, members: Mapping[str, bytes]
        ) -> dict[str, bytes]:
            await asyncio.sleep(0)
            return dict.fromkeys(members, b"all")

        async def on_join_complete(self, generation: int, member_id: str, protocol: str, data: bytes) -> None:
            calls.append(("complete", data == b"all"))

        def on_leave_prepare(self) -> None:
            calls.append(("leave", threading.current_thread() is threading.main_thread()))

    async def main() -> None:
        async with aio.connect(url) as session:
            coordinator = await session.coordinator("jobs", "consumer", Handler(), rebalance_timeout=10)
            generation = await coordinator.ensure_active_group()
            assert coordinator.generation() == generation
            await coordinator.close()

    run(main)
    assert calls == [("prepare", True), ("complete", True), ("leave", True)]


def test_incremental_coordinator_with_an_async_listener(url: str) -> None:
    owned: set[str] = set()

    class Listener:
        async def on_assigned(self, resources: frozenset[str]) -> None:
            await asyncio.sleep(0)
            owned.update(resources)

        async def on_revoked(self, resources: frozenset[str]) -> None:
            owned.difference_update(resources)

    async def main() -> None:
        async with aio.connect(url) as session:
            member = await session.incremental_coordinator("shards", ["a", "b", "c"], Listener())
            await member.ensure_active_group()
            assert owned == {"a", "b", "c"} == member.assignment()
            await member.close()
            assert owned == set()

    run(main)


def test_bad_arguments_fail_before_io(tmp_path: Path) -> None:
    with pytest.raises(ca.ConfigurationError):
        aio.connect(f"sqlite:///{tmp_path / 'x.db'}", workers=0)

    async def main() -> None:
        with pytest.raises(ca.ConfigurationError, match="unknown option"):
            await aio.connect(f"sqlite:///{tmp_path / 'x.db'}", bogus=1)
        async with aio.connect(f"sqlite:///{tmp_path / 'x.db'}") as session:
            with pytest.raises(ca.InvalidTypeError):
                await session.storage.put("k", "not bytes")  # type: ignore[arg-type]
            with pytest.raises(ca.InvalidTypeError):
                await session.coordinator("g", "t", object())  # type: ignore[arg-type]

    run(main)


def test_cancelled_in_flight_write_says_its_effect_is_unknown_and_state_stays_whole(
    postgresql_target: str, postgresql_server: ServerHandle
) -> None:
    """A join cancelled while the server is frozen (SIGSTOP) raises CancelledError saying the
    effect is unknown; once the server is back the session either holds the member (leave works)
    or not (NotAMemberError), in agreement with the group's live members - never half of it."""

    async def main() -> None:
        async with aio.connect(postgresql_target, request_timeout=5) as session:
            group = session.group("frozen")
            await group.members()
            postgresql_server.pause()
            try:
                joining = asyncio.create_task(group.join("m1"))
                await asyncio.sleep(0.5)
                joining.cancel()
                with pytest.raises(asyncio.CancelledError) as cancelled:
                    await joining
            finally:
                postgresql_server.resume()
            assert "effect is unknown" in str(cancelled.value)
            await asyncio.sleep(6)  # the in-flight call completes or fails within request_timeout
            live = await group.members()
            try:
                await group.leave("m1")
                held = True
            except ca.NotAMemberError:
                held = False
            assert held == ("m1" in live), (held, live)

    run(main)


def test_cancelled_before_it_started_never_runs(
    postgresql_target: str, postgresql_server: ServerHandle
) -> None:
    """With one worker busy on a frozen server, a queued join that is cancelled is never applied.
    (Storage calls on PostgreSQL take no worker: its asyncio storage; group calls do.)"""

    async def main() -> None:
        async with aio.connect(postgresql_target, workers=1, request_timeout=3) as session:
            group = session.group("queued")
            await group.members()
            postgresql_server.pause()
            try:
                busy = asyncio.create_task(group.members())
                queued = asyncio.create_task(group.join("never"))
                await asyncio.sleep(0.3)
                queued.cancel()
                with pytest.raises(asyncio.CancelledError) as cancelled:
                    await queued
                assert "unknown" not in str(cancelled.value)
            finally:
                postgresql_server.resume()
            await asyncio.gather(busy, return_exceptions=True)  # done or timed out: either is fine
            assert await group.members() == frozenset()

    run(main)


def test_calls_after_close_raise_session_lost(tmp_path: Path) -> None:
    async def main() -> None:
        session = await aio.connect(f"sqlite:///{tmp_path / 'x.db'}")
        await session.storage.put("k", b"v")
        await session.close()
        with pytest.raises(ca.SessionLostError, match="closed"):
            await session.storage.fetch("k")

    run(main)


def test_resource_handlers_with_async_listeners_share_the_resources(tmp_path: Path) -> None:
    """Two ``AsyncResourceHandler`` members split the resources without overlap, their ``async def``
    listeners run on the loop; when one leaves, the other takes everything (cooperatively)."""
    url = f"sqlite:///{tmp_path / 'resources.db'}"
    resources = {"a", "b", "c", "d"}

    class Listener:
        def __init__(self) -> None:
            self.owned: set[str] = set()
            self.on_loop = True

        async def on_assigned(self, assigned: frozenset[str]) -> None:
            self.on_loop &= threading.current_thread() is threading.main_thread()
            self.owned |= assigned

        async def on_revoked(self, revoked: frozenset[str]) -> None:
            self.owned -= revoked

    async def settled(members: list[aio.AsyncCoordinator], listeners: list[Listener]) -> None:
        """Until each member owns a share: together all the resources, each once."""
        deadline = time.monotonic() + TIMEOUT
        while True:
            for member in members:
                await member.ensure_active_group()
            owned = [listener.owned for listener in listeners]
            if all(owned) and set().union(*owned) == resources and sum(map(len, owned)) == len(resources):
                return
            assert time.monotonic() < deadline, owned
            await asyncio.sleep(0.1)

    async def main() -> None:
        async with aio.connect(url) as first, aio.connect(url) as second:
            listeners = [Listener(), Listener()]
            handlers = [aio.AsyncResourceHandler(resources, listener) for listener in listeners]
            assert handlers[0].cooperative and handlers[0].resources == resources
            members = [
                await handler.join(session, "shards", rebalance_timeout=5)
                for handler, session in zip(handlers, (first, second), strict=True)
            ]
            await settled(members, listeners)
            assert [handler.owned for handler in handlers] == [listener.owned for listener in listeners]
            await members[0].close()
            assert listeners[0].owned == set()
            await settled(members[1:], listeners[1:])
            assert all(listener.on_loop for listener in listeners)

    run(main)
