"""The bridged migration's scenario, run by the SQLite and the real-server tests alike."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import consensus_api as ca
from consensus_api.bridging import BridgeBackend
from consensus_api.migrate import cutover, migrate

WAIT = 60.0


def wait_for(predicate: Callable[[], Any], timeout: float = WAIT) -> Any:
    """The first truthy value of ``predicate``, polled; AssertionError after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"not true within {timeout} s: {predicate}")


def bridge_of(session: ca.Session) -> BridgeBackend:
    """The bridge behind a bridged session."""
    backend = session._backend
    assert isinstance(backend, BridgeBackend)
    return backend


def cut_over_with_a_leader_a_lock_and_a_member(old: str, new: str, **options: Any) -> None:
    """A bridged leader, lock holder and member on OLD move to NEW at the cut-over: told first
    (LeaderChanged(None), LockLost), then back on NEW with terms and tokens above OLD's; a write
    fenced by the OLD leadership is refused; an unfenced write lands on NEW."""
    session = ca.connect(old, migrate_to=new, **options)
    try:
        session.storage.put("config", b"v1")
        events: list[ca.LeaderChanged] = []
        lost: list[ca.LockLost] = []
        election = session.election("svc")
        election.add_listener(events.append)
        assert election.nominate("c1")
        old_leadership = election.leadership()
        assert old_leadership is not None
        lock = session.lock("res")
        lease = lock.acquire(timeout=WAIT)
        assert lease is not None
        lock.add_listener(lost.append)
        session.group("workers").join("w1", b"d")
        migrate(old, new, options=options)
        marker = cutover(old, new, timeout=WAIT, options=options)
        assert marker.floor >= max(old_leadership.term, lease.token)
        wait_for(lambda: bridge_of(session).authority == "new")
        moved = wait_for(lambda: [e for e in events if e.term is not None and e.term > marker.floor])
        index = events.index(moved[0])
        assert any(e.leader_id is None for e in events[:index]), events
        assert wait_for(lambda: lost)[0].token == lease.token
        leadership = wait_for(election.leadership)
        assert leadership.leader_id == "c1"
        assert leadership.term > old_leadership.term
        try:
            session.storage.put("fenced", b"x", fence=old_leadership)
            raise AssertionError("a write fenced by the OLD leadership was applied on NEW")
        except ca.FencedError:
            pass
        assert session.storage.put("fenced", b"y", fence=leadership) >= 1
        lock.release()
        again = lock.acquire(timeout=WAIT)
        assert again is not None
        assert again.token > lease.token
        lock.release()
        assert wait_for(lambda: session.group("workers").members())
        session.storage.update("config", b"v2")
        with ca.connect(new, **options) as plain:
            found = plain.storage.fetch("config")
            assert found is not None
            assert found.value == b"v2"
            assert plain.group("workers").membership() == {"w1": b"d"}
    finally:
        session.close()


def write_waits_for_authority(session: ca.Session, hand_over: Callable[[], None]) -> None:
    """An unfenced write caught by the seal waits, and lands on NEW once ``hand_over`` moved authority."""
    results: list[object] = []
    writer = threading.Thread(target=lambda: results.append(session.storage.put("late", b"x")))
    writer.start()
    time.sleep(0.5)
    assert not results
    hand_over()
    writer.join(WAIT)
    assert results and isinstance(results[0], int)
