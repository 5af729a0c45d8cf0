"""The Redis backend's migration SPI against a real redis-server: the seal refuses every storage write
of every session and is atomic with each (the storage scripts check it), the term ceiling (also over
term counters a release before it left, and only under its own prefix), live sessions. The behaviour
every backend shares is the conformance suite's ``migration`` section."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
import redis

import consensus_api as ca
from consensus_api.errors import SealedError
from consensus_redis.layout import Layout
from consensus_testkit import ServerHandle, start_server
from consensus_testkit.conformance.helpers import spi

WRITERS = 4


@pytest.fixture(scope="module")
def server() -> Iterator[ServerHandle]:
    with start_server("redis") as handle:
        yield handle


@pytest.fixture
def prefix() -> str:
    return f"t-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def raw(server: ServerHandle) -> Iterator[redis.Redis]:
    client = redis.Redis(host=server.host, port=server.port, socket_timeout=10)
    yield client
    client.close()


@pytest.fixture
def connect(server: ServerHandle, prefix: str) -> Iterator[Callable[..., ca.Session]]:
    """Sessions on the server under ``prefix`` (or another one), closed at teardown."""
    sessions: list[ca.Session] = []

    def open_session(under: str = prefix) -> ca.Session:
        sessions.append(ca.connect(f"{server.url}{under}", session_timeout=5.0, request_timeout=10.0))
        return sessions[-1]

    yield open_session
    for session in sessions:
        session.close()


def _sealed_error(write: Callable[[], object]) -> None:
    with pytest.raises(SealedError):
        write()


def test_seal_refuses_every_write_of_another_session_until_unseal(connect: Callable[..., ca.Session]) -> None:
    """After seal() every put, update and delete of another session (plain, at a version, fenced, on a
    missing or existing key) is refused and changes nothing; members, candidates and reads go on; a
    store under another prefix is not sealed; unseal() lets writes through again."""
    sealing, writer, elsewhere = connect(), connect(), connect(f"o-{uuid.uuid4().hex[:8]}")
    kept = writer.storage.put("a/kept", b"before")
    election = writer.election("svc")
    assert election.nominate("c")
    fence = election.leadership()
    assert fence is not None
    spi(sealing).seal()
    assert spi(writer).sealed() and not spi(elsewhere).sealed()
    store = writer.storage
    for write in (
        lambda: store.put("a/new", b"x"),
        lambda: store.put("a/kept", b"x"),
        lambda: store.update("a/kept", b"x", version=kept),
        lambda: store.update("a/kept", b"x", version=kept + 7),
        lambda: store.update("a/missing", b"x"),
        lambda: store.update("a/kept", b"x", fence=ca.Leadership("svc", "c", fence.term + 5)),
        lambda: store.delete("a/kept"),
        lambda: store.delete("a/missing"),
    ):
        _sealed_error(write)
    assert store.fetch("a/kept") == ca.Versioned(b"before", kept)
    assert store.keys("a") == frozenset({"a/kept"})
    assert elsewhere.storage.put("a/new", b"x") > 0
    writer.group("g").join("m", b"d")
    assert sealing.group("g").membership() == {"m": b"d"}
    assert not sealing.election("svc").nominate("d")
    spi(sealing).unseal()
    assert not spi(writer).sealed()
    assert store.update("a/kept", b"after", version=kept, fence=fence) > kept


def test_writers_racing_a_seal_are_applied_before_it_or_refused(connect: Callable[..., ca.Session]) -> None:
    """Writers put fresh keys while another session seals: every acknowledged put is there with its
    version, every refused one is absent, and every put begun after seal() returned is refused."""
    sessions = [connect() for _ in range(WRITERS)]
    sealing = connect()
    sealed_at: list[float] = []
    results: list[dict[str, object]] = [{} for _ in sessions]
    began: list[dict[str, float]] = [{} for _ in sessions]

    def write(index: int) -> None:
        for n in range(100_000):
            key = f"w{index}/{n}"
            began[index][key] = time.monotonic()
            try:
                results[index][key] = sessions[index].storage.put(key, b"v")
            except SealedError as exc:
                results[index][key] = exc
                if sealed_at and began[index][key] > sealed_at[0] + 0.2:
                    return
            except ca.OperationTimeoutError as exc:  # effect unknown: neither claim applies
                results[index][key] = exc

    threads = [threading.Thread(target=write, args=(i,), daemon=True) for i in range(WRITERS)]
    for thread in threads:
        thread.start()
    time.sleep(0.5)
    spi(sealing).seal()
    sealed_at.append(time.monotonic())
    for thread in threads:
        thread.join(60)
    spi(sealing).unseal()
    acknowledged = refused = 0
    for index, outcomes in enumerate(results):
        for key, outcome in outcomes.items():
            found = sealing.storage.fetch(key)
            if isinstance(outcome, int):
                acknowledged += 1
                assert found == ca.Versioned(b"v", outcome), key
                assert began[index][key] < sealed_at[0], f"{key} was applied after seal() returned"
            elif isinstance(outcome, SealedError):
                refused += 1
                assert found is None, f"{key} was refused but applied"
    assert acknowledged > 0 and refused >= WRITERS


def test_term_ceiling_covers_elections_and_lock_tokens_and_never_goes_down(
    connect: Callable[..., ca.Session],
) -> None:
    """term_ceiling() is at least every term an election gave and every lock token, stays so after the
    leaders resign, and terms start at 1."""
    first, second = connect(), connect()
    assert spi(first).term_ceiling() == 0
    election = first.election("svc")
    assert election.nominate("a")
    led = election.leadership()
    assert led is not None and led.term >= 1
    assert spi(first).term_ceiling() >= led.term
    assert not second.election("svc").nominate("b")
    election.resign("a")
    with second.lock("res") as lease:
        assert lease.token >= 1
        assert spi(second).term_ceiling() >= lease.token
        token = lease.token
    after = second.election("svc").leadership()
    assert after is not None and after.term > led.term
    ceiling = spi(first).term_ceiling()
    assert ceiling >= max(after.term, token)
    second.election("svc").resign("b")
    assert spi(first).term_ceiling() == ceiling


def test_term_ceiling_counts_terms_issued_before_it_was_first_asked(
    connect: Callable[..., ca.Session], raw: redis.Redis, prefix: str
) -> None:
    """On a store whose terms were issued by a release without the ceiling (no ``ceiling`` key), the
    first term_ceiling() reads every term counter under its prefix, and none under another prefix,
    even one that the prefix matches as a glob pattern."""
    globbing, matched = f"{prefix}-*", f"{prefix}-x"
    session, other = connect(globbing), connect(matched)
    assert session.election("svc").nominate("a")
    raw.delete(Layout.from_path(f"/{globbing}").key("ceiling"))
    raw.set(Layout.from_path(f"/{globbing}").key("t", "old-service"), 41)
    raw.set(Layout.from_path(f"/{matched}").key("t", "other-service"), 99)
    assert spi(session).term_ceiling() == 41
    assert spi(other).term_ceiling() == 99


def test_live_sessions_lists_every_open_session_and_drops_a_closed_one(
    connect: Callable[..., ca.Session],
) -> None:
    """Each session's identity is its session key's id; live_sessions() of either lists both, and no
    longer the one that closed."""
    first, second = connect(), connect()
    ids = spi(first).session_identity(), spi(second).session_identity()
    assert ids[0] != ids[1]
    for backend in (spi(first), spi(second)):
        live = backend.live_sessions()
        assert live is not None and set(ids) <= live
    second.close()
    live = spi(first).live_sessions()
    assert live is not None and ids[0] in live and ids[1] not in live
