"""Migration: the term floor that keeps tokens rising across a cut-over.

Contract: <https://consensus-api.github.io/consensus-api/spec/#14-migration-between-backends>

A store's floor (``consensus_api.floor``) is added to every term it reports and taken off every
fence passed down. These tests raise it with ``raise_floor`` (what ``consensus migrate cutover``
does) and put the store's floor back at teardown (the ``floor_keeper`` fixture), so the tests
after them see the store as they found it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from consensus_api import ConsensusError, FencedError, LeaderChanged, Leadership, aio
from consensus_api.backend import Backend
from consensus_api.floor import FLOOR_KEY, FloorBackend, parse_floor, raise_floor
from consensus_api.keys import MAX_VERSION
from consensus_testkit.conformance.helpers import EVENT_TIMEOUT, SessionFactory, spi, unique, wait_until

#: A floor far above any native term (2^62), leaving every backend's native terms room below 2^63.
HIGH_FLOOR = 2**62


@pytest.fixture
def floor_keeper(consensus_open_session: SessionFactory) -> Iterator[FloorBackend]:
    """The floor-aware backend of a session of its own; the store's floor is put back at teardown."""
    backend = spi(consensus_open_session())
    assert isinstance(backend, FloorBackend)
    native: Backend = backend.inner
    before = native.fetch(FLOOR_KEY)
    yield backend
    now = native.fetch(FLOOR_KEY)
    if before is None and now is not None:
        native.delete(FLOOR_KEY, now.version, None)
    elif before is not None and now is not None:
        native.update(FLOOR_KEY, before.value, now.version, None)


def _above_ceiling(backend: FloorBackend) -> int:
    """A floor above every term the store has issued so far."""
    return backend.term_ceiling() + 1000


def test_raised_floor_lifts_later_terms_and_lock_tokens(
    floor_keeper: FloorBackend, consensus_open_session: SessionFactory, consensus_ns: str
) -> None:
    """After the floor is raised to F, every new term and lock token is above F and below 2^63, and
    fenced writes with them are applied."""
    floor = raise_floor(floor_keeper, max(HIGH_FLOOR, _above_ceiling(floor_keeper)))
    assert parse_floor(floor_keeper.inner.fetch(FLOOR_KEY)) == floor
    session = consensus_open_session()
    election = session.election(unique("ct-service"))
    assert election.nominate("c0")
    leadership = election.leadership()
    assert leadership is not None
    assert floor < leadership.term <= MAX_VERSION
    assert session.storage.put(f"{consensus_ns}/led", b"x", fence=leadership) >= 1
    lock = session.lock(unique("ct-lock"))
    lease = lock.acquire(timeout=EVENT_TIMEOUT)
    assert lease is not None
    assert floor < lease.token <= MAX_VERSION
    assert session.storage.put(f"{consensus_ns}/locked", b"x", fence=lease) >= 1
    assert floor < spi(session).term_ceiling() <= MAX_VERSION
    lock.release()


def test_a_fence_from_before_the_raise_is_refused(
    floor_keeper: FloorBackend, consensus_open_session: SessionFactory, consensus_ns: str
) -> None:
    """A live leader sees the raise (a LeaderChanged with a term above the floor); a write fenced by
    its pre-floor leadership raises FencedError and changes nothing; its lifted leadership writes."""
    session = consensus_open_session()
    election = session.election(unique("ct-service"))
    seen: list[LeaderChanged] = []
    changed = threading.Event()

    def on_change(event: LeaderChanged) -> None:
        seen.append(event)
        changed.set()

    election.add_listener(on_change)
    assert election.nominate("c0")
    before = election.leadership()
    assert before is not None
    floor = raise_floor(floor_keeper, _above_ceiling(floor_keeper))
    assert before.term <= floor
    wait_until(lambda: any(e.term is not None and e.term > floor for e in seen), EVENT_TIMEOUT)
    lifted = election.leadership()
    assert lifted is not None
    assert lifted.leader_id == "c0"
    assert lifted.term > floor
    key = f"{consensus_ns}/fenced"
    with pytest.raises(FencedError):
        session.storage.put(key, b"stale", fence=before)
    assert session.storage.fetch(key) is None
    assert session.storage.put(key, b"fresh", fence=lifted) >= 1


def test_a_floor_that_would_pass_2_63_is_refused(floor_keeper: FloorBackend) -> None:
    """``raise_floor`` refuses, writing nothing, a floor that would push the store's terms past 2^63-1."""
    before = floor_keeper.inner.fetch(FLOOR_KEY)
    with pytest.raises(ConsensusError):
        raise_floor(floor_keeper, MAX_VERSION)
    assert floor_keeper.inner.fetch(FLOOR_KEY) == before


def test_the_floor_never_goes_down(floor_keeper: FloorBackend) -> None:
    """Raising to a lower value keeps the higher floor; the ceiling through the floor rises with it."""
    high = raise_floor(floor_keeper, _above_ceiling(floor_keeper))
    assert raise_floor(floor_keeper, high - 1) == high
    assert floor_keeper.term_ceiling() >= high


def test_aio_writes_translate_fences_with_the_floor(
    floor_keeper: FloorBackend,
    consensus_open_session: SessionFactory,
    consensus_url: str,
    consensus_options: dict[str, Any],
    consensus_ns: str,
) -> None:
    """Through ``consensus_api.aio`` (the backend's asyncio storage, or the no-wait and worker paths)
    a pre-floor fence raises FencedError and changes nothing; the lifted leadership writes."""
    leader = consensus_open_session()
    election = leader.election(unique("ct-service"))
    assert election.nominate("c0")
    before = election.leadership()
    assert before is not None
    floor = raise_floor(floor_keeper, _above_ceiling(floor_keeper))

    def lifted_leadership() -> Leadership | None:
        found = election.leadership()
        return found if found is not None and found.term > floor else None

    lifted = wait_until(lifted_leadership, EVENT_TIMEOUT)
    key = f"{consensus_ns}/aio-fenced"

    async def main() -> None:
        async with aio.connect(consensus_url, **consensus_options) as session:
            with pytest.raises(FencedError):
                await session.storage.put(key, b"stale", fence=before)
            assert await session.storage.fetch(key) is None
            assert await session.storage.put(key, b"fresh", fence=lifted) >= 1

    asyncio.run(asyncio.wait_for(main(), EVENT_TIMEOUT * 2))
