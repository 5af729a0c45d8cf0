"""The SQL backend's migration SPI on SQLite (a file), PostgreSQL and MariaDB: the seal refuses every
storage write of every session (the nowait writer's too) and is atomic with each write, by the lock
protocol ``consensus_backends.sql.seal`` proves; the term ceiling; live sessions; and a database made
before the seal table existed. The behaviour every backend shares is the conformance suite's
``migration`` section; these tests cover how this backend gets it."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import sqlalchemy

import consensus_api as ca
from consensus_api.backend import Backend
from consensus_api.config import Options, Secret, Security, parse_url
from consensus_api.errors import SealedError
from consensus_backends.sql import storage
from consensus_backends.sql.client import begin_sqlite, create
from consensus_backends.sql.layout import Tables
from consensus_backends.sql.seal import set_sealed
from consensus_testkit import ServerHandle
from consensus_testkit.conformance.helpers import spi

#: How long a write or seal that waits for the other's transaction is seen to wait.
BLOCKED_FOR = 0.5
WRITERS = 4


@pytest.fixture(params=["sqlite", "postgresql", "mariadb"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh store: a SQLite file, or a table prefix of its own on the session's server."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/seal.db"
    server: ServerHandle = request.getfixturevalue(f"{request.param}_server")
    return f"{server.url}?table_prefix=Seal{uuid.uuid4().hex[:8]}_"  # mixed case: quoted names


@pytest.fixture
def connect(target: str) -> Iterator[Callable[[], ca.Session]]:
    """Sessions on ``target``, closed at teardown."""
    sessions: list[ca.Session] = []

    def open_session() -> ca.Session:
        sessions.append(ca.connect(target, session_timeout=5.0, request_timeout=10.0))
        return sessions[-1]

    yield open_session
    for session in sessions:
        session.close()


def _sealed_error(write: Callable[[], object]) -> None:
    with pytest.raises(SealedError):
        write()


def test_seal_refuses_every_write_of_another_session_until_unseal(connect: Callable[[], ca.Session]) -> None:
    """After seal() every put, update and delete of another session (plain, at a version, fenced, on a
    missing or existing key; on SQLite also the nowait writer's) is refused and changes nothing;
    members, candidates and reads go on; unseal() lets writes through again."""
    sealing, writer = connect(), connect()
    kept = writer.storage.put("a/kept", b"before")
    election = writer.election("svc")
    assert election.nominate("c")
    fence = election.leadership()
    assert fence is not None
    spi(sealing).seal()
    assert spi(writer).sealed() and spi(sealing).sealed()
    store = writer.storage
    for write in (
        lambda: store.put("a/new", b"x"),
        lambda: store.put("a/kept", b"x"),
        lambda: store.update("a/kept", b"x"),
        lambda: store.update("a/kept", b"x", version=kept),
        lambda: store.update("a/kept", b"x", version=kept + 7),
        lambda: store.update("a/missing", b"x"),
        lambda: store.update("a/kept", b"x", fence=fence),
        lambda: store.update("a/kept", b"x", fence=ca.Leadership("svc", "c", fence.term + 5)),
        lambda: store.delete("a/kept"),
        lambda: store.delete("a/missing"),
    ):
        _sealed_error(write)
    nowait = spi(writer).nowait_writer()
    if nowait is not None:
        _sealed_error(lambda: nowait.put("a/nowait", b"x", None))
        _sealed_error(lambda: nowait.update("a/kept", b"x", None, None))
        _sealed_error(lambda: nowait.delete("a/kept", None, None))
    assert store.fetch("a/kept") == ca.Versioned(b"before", kept)
    assert store.keys("a") == frozenset({"a/kept"})
    writer.group("g").join("m", b"d")
    assert sealing.group("g").membership() == {"m": b"d"}
    assert not sealing.election("svc").nominate("d")
    spi(sealing).unseal()
    assert not spi(writer).sealed()
    assert store.update("a/kept", b"after", version=kept, fence=fence) > kept
    assert store.put("a/new", b"x") > 0


def _storage_write(
    target: str, work: Callable[[sqlalchemy.Connection, Tables], object]
) -> Callable[[], None]:
    """Begin a write transaction of ``target`` on a connection of its own and run ``work`` in it;
    the returned call commits it (the transaction holds its locks until then)."""
    url, query = parse_url(target)
    password = None if url.password is None else Secret(url.password)
    engine = create(
        url, Options(request_timeout=10.0, security=Security(username=url.username, password=password))
    )
    conn = engine.connect()
    transaction = conn.begin()
    begin_sqlite(conn, write=True)
    work(conn, Tables(str(query.get("table_prefix", "consensus_"))))

    def commit() -> None:
        transaction.commit()
        conn.close()
        engine.dispose()

    return commit


def _in_thread(call: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(call())
        except Exception as exc:  # the outcome is what the test looks at
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def test_a_write_waits_for_a_seal_in_flight_and_is_then_refused(
    target: str, connect: Callable[[], ca.Session]
) -> None:
    """While a transaction that seals has not committed, a write of another session waits for it
    (SQLite: the write lock; PostgreSQL: the table lock on kv; MariaDB: the seal row's lock), then reads
    the seal and is refused, not applied."""
    writer = connect()
    writer.storage.put("k", b"before")
    commit_seal = _storage_write(target, lambda conn, t: set_sealed(conn, t, True))
    thread, outcome = _in_thread(lambda: writer.storage.update("k", b"after"))
    thread.join(BLOCKED_FOR)
    assert thread.is_alive(), f"the write did not wait for the seal in flight: {outcome}"
    commit_seal()
    thread.join(15)
    assert len(outcome) == 1 and isinstance(outcome[0], SealedError)
    assert writer.storage.fetch("k") == ca.Versioned(b"before", 1)


def test_a_seal_waits_for_a_write_in_flight_which_is_then_applied(
    target: str, connect: Callable[[], ca.Session]
) -> None:
    """A write that has passed the seal check holds the seal off until it commits, so it is applied
    before the seal, never after seal() returned."""
    sealing = connect()
    commit_write = _storage_write(target, lambda conn, t: storage.put(conn, t, "k", b"in flight"))
    thread, outcome = _in_thread(lambda: spi(sealing).seal())
    thread.join(BLOCKED_FOR)
    assert thread.is_alive(), f"the seal did not wait for the write in flight: {outcome}"
    commit_write()
    thread.join(15)
    assert outcome == [None]
    assert sealing.storage.fetch("k") == ca.Versioned(b"in flight", 1)
    _sealed_error(lambda: sealing.storage.put("j", b"x"))


def test_writers_racing_a_seal_are_applied_before_it_or_refused(connect: Callable[[], ca.Session]) -> None:
    """Writers put fresh keys while another session seals: every acknowledged put is there with its
    version, every refused one is absent, and every put begun after seal() returned is refused."""
    sessions = [connect() for _ in range(WRITERS)]
    sealing = connect()
    sealed_at: list[float] = []
    results: list[dict[str, object]] = [{} for _ in sessions]
    began: list[dict[str, float]] = [{} for _ in sessions]

    def write(index: int) -> None:
        for n in range(10_000):
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
    connect: Callable[[], ca.Session],
) -> None:
    """term_ceiling() is at least every term an election gave and every lock token, stays so after the
    leaders resign, and terms start at 1."""
    first, second = connect(), connect()
    backend: Backend = spi(first)
    start = backend.term_ceiling()
    assert start >= 0
    election = first.election("svc")
    assert election.nominate("a")
    led = election.leadership()
    assert led is not None and led.term >= 1
    assert backend.term_ceiling() >= led.term
    assert not second.election("svc").nominate("b")
    election.resign("a")
    with second.lock("res") as lease:
        token = lease.token
        assert token >= 1
        assert spi(second).term_ceiling() >= token
    after = second.election("svc").leadership()
    assert after is not None and after.term > led.term
    ceiling = backend.term_ceiling()
    assert ceiling >= max(after.term, token)
    second.election("svc").resign("b")
    assert backend.term_ceiling() == ceiling


def test_live_sessions_lists_every_open_session_and_drops_a_closed_one(
    connect: Callable[[], ca.Session],
) -> None:
    """Each session's identity is its lease row; live_sessions() of either lists both, and no longer
    the one that closed."""
    first, second = connect(), connect()
    ids = spi(first).session_identity(), spi(second).session_identity()
    assert ids[0] != ids[1]
    for backend in (spi(first), spi(second)):
        live = backend.live_sessions()
        assert live is not None and set(ids) <= live
    second.close()
    live = spi(first).live_sessions()
    assert live is not None and ids[0] in live and ids[1] not in live


def test_a_database_made_before_the_seal_table_gains_it_on_open(tmp_path: Path) -> None:
    """A SQLite file without the seal table (as the release before it made them) opens: the table and
    its row are created, its data is kept, and the seal works."""
    url = f"sqlite:///{tmp_path}/old.db"
    with ca.connect(url) as session:
        session.storage.put("k", b"old")
    engine = sqlalchemy.create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql("DROP TABLE consensus_seal")
    engine.dispose()
    with ca.connect(url) as sealing, ca.connect(url) as writer:
        assert writer.storage.fetch("k") == ca.Versioned(b"old", 1)
        assert not spi(writer).sealed()
        spi(sealing).seal()
        _sealed_error(lambda: writer.storage.update("k", b"new"))
        spi(sealing).unseal()
        assert writer.storage.update("k", b"new") == 2
