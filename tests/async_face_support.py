"""What every backend's asyncio storage face (``Backend.async_storage``) must show against a real
server: the same results and errors as the backend's blocking calls for the same operations, the
fence refused the same way, and 1,000 fetches in flight at once (``test_etcd_async.py``,
``test_zookeeper_async.py``)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import consensus_api as ca
from consensus_api.backend import AsyncStorage, Backend

#: A value above ZooKeeper's one-znode limit (stored in chunks there).
LARGE = bytes(range(256)) * 4_700


def outcome(call: Callable[[], object]) -> object:
    """What a blocking call returned, or its error's type and message."""
    try:
        return call()
    except ca.ConsensusError as exc:
        return type(exc), str(exc)


async def outcome_async(call: Callable[[], Awaitable[object]]) -> object:
    """What an awaited call returned, or its error's type and message."""
    try:
        return await call()
    except ca.ConsensusError as exc:
        return type(exc), str(exc)


async def same_as_blocking(backend: Backend) -> None:
    """Writes through the face read back both ways; failing writes fail as the blocking ones do."""
    face = backend.async_storage()
    assert face is not None
    try:
        assert await face.fetch("a/k") is None
        first = await face.put("a/k", b"1", None)
        assert backend.fetch("a/k") == ca.Versioned(b"1", first) == await face.fetch("a/k")
        second = await face.update("a/k", b"2", first, None)
        third = await face.update("a/k", b"3", None, None)
        assert first < second < third
        assert await face.keys("a") == backend.keys("a") == {"a/k"}
        assert await face.keys("") == backend.keys("")
        assert await face.keys("none") == backend.keys("none") == frozenset()
        failing: list[tuple[Callable[[], object], Callable[[], Awaitable[object]]]] = [
            (lambda: backend.put("a/k", b"x", None), lambda: face.put("a/k", b"x", None)),
            (lambda: backend.update("a/k", b"x", first, None), lambda: face.update("a/k", b"x", first, None)),
            (lambda: backend.delete("a/k", second, None), lambda: face.delete("a/k", second, None)),
            (lambda: backend.update("a/no", b"x", None, None), lambda: face.update("a/no", b"x", None, None)),
            (lambda: backend.update("a/no", b"x", 1, None), lambda: face.update("a/no", b"x", 1, None)),
            (lambda: backend.delete("a/no", None, None), lambda: face.delete("a/no", None, None)),
        ]
        for blocking, awaited in failing:
            expected = outcome(blocking)
            assert isinstance(expected, tuple) and issubclass(expected[0], ca.ConsensusError)
            assert await outcome_async(awaited) == expected
        await face.delete("a/k", third, None)
        assert backend.fetch("a/k") is None and await face.fetch("a/k") is None
        assert await face.keys("a") == backend.keys("a") == frozenset()
        large = await face.put("deep/er/large", LARGE, None)
        assert (
            await face.fetch("deep/er/large") == backend.fetch("deep/er/large") == ca.Versioned(LARGE, large)
        )
        replaced = await face.update("deep/er/large", LARGE[::-1], large, None)
        assert await face.fetch("deep/er/large") == ca.Versioned(LARGE[::-1], replaced)
        await face.delete("deep/er/large", None, None)
        assert backend.fetch("deep/er/large") is None
    finally:
        await face.aclose()
        await face.aclose()  # idempotent


async def fences_as_blocking(backend: Backend) -> None:
    """A fenced write through the face passes while its leadership is current, and is refused, as
    the blocking write is, once it is not (or was never) current."""
    face = backend.async_storage()
    assert face is not None
    try:
        assert backend.nominate("svc", "leader")
        lead = backend.leadership("svc")
        assert lead is not None
        version = await face.put("f", b"by leader", lead)
        version = await face.update("f", b"again", version, lead)
        forged = [ca.Leadership("svc", "other", lead.term), ca.Leadership("svc", "leader", lead.term + 1)]
        for fence in forged:
            await refused_alike(backend, face, fence)
        backend.resign("svc", "leader")
        await refused_alike(backend, face, lead)
        assert await face.fetch("f") == backend.fetch("f") == ca.Versioned(b"again", version)
        await face.delete("f", version, None)
    finally:
        await face.aclose()


async def refused_alike(backend: Backend, face: AsyncStorage, fence: ca.Leadership) -> None:
    """Every write with ``fence`` is refused with ``FencedError`` through the face and blocking."""
    writes: list[tuple[Callable[[], object], Callable[[], Awaitable[object]]]] = [
        (lambda: backend.put("g", b"x", fence), lambda: face.put("g", b"x", fence)),
        (lambda: backend.update("f", b"x", None, fence), lambda: face.update("f", b"x", None, fence)),
        (lambda: backend.delete("f", None, fence), lambda: face.delete("f", None, fence)),
    ]
    for blocking, awaited in writes:
        expected = outcome(blocking)
        assert isinstance(expected, tuple) and expected[0] is ca.FencedError
        assert await outcome_async(awaited) == expected


async def many_in_flight(backend: Backend, count: int = 1_000) -> None:
    """``count`` fetches gathered at once all complete with the stored value."""
    face = backend.async_storage()
    assert face is not None
    try:
        version = await face.put("hot", b"value", None)
        answers = await asyncio.wait_for(
            asyncio.gather(*(face.fetch("hot") for _ in range(count))), timeout=120
        )
        assert answers == [ca.Versioned(b"value", version)] * count
        keys = await asyncio.gather(*(face.keys("") for _ in range(count // 10)))
        assert set(keys) == {frozenset({"hot"})}
    finally:
        await face.aclose()


async def sealed_as_blocking(backend: Backend) -> None:
    """On a sealed store every write through the face is refused with ``SealedError``, as the
    blocking one is, and applies nothing; after ``unseal`` writes pass again."""
    face = backend.async_storage()
    assert face is not None
    try:
        version = await face.put("s", b"before", None)
        backend.seal()
        try:
            writes: list[tuple[Callable[[], object], Callable[[], Awaitable[object]]]] = [
                (lambda: backend.put("t", b"x", None), lambda: face.put("t", b"x", None)),
                (lambda: backend.update("s", b"x", None, None), lambda: face.update("s", b"x", None, None)),
                (lambda: backend.delete("s", version, None), lambda: face.delete("s", version, None)),
            ]
            for blocking, awaited in writes:
                expected = outcome(blocking)
                assert isinstance(expected, tuple) and expected[0] is ca.SealedError
                assert await outcome_async(awaited) == expected
            assert await face.fetch("s") == ca.Versioned(b"before", version)
            assert await face.fetch("t") is None
        finally:
            backend.unseal()
        assert await face.update("s", b"after", version, None) > version
    finally:
        await face.aclose()
