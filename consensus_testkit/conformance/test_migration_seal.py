"""Migration: the seal, the term ceiling and the list of live sessions a cut-over relies on.

Contract: <https://consensus-api.github.io/consensus-api/spec/#14-migration-between-backends>

These tests call the backend SPI (``helpers.spi``): ``seal``, ``unseal``, ``sealed``,
``term_ceiling``, ``session_identity`` and ``live_sessions`` are made by the migration's
tools, not by applications. A test that seals the tested store unseals it at teardown
(the ``sealer`` fixture), so the tests after it find it writable.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest

from consensus_api import ConsensusError, Leadership, OperationTimeoutError, SealedError, Session, Versioned
from consensus_api.backend import Backend
from consensus_testkit.conformance.helpers import EVENT_TIMEOUT, SessionFactory, spi, unique, wait_until
from consensus_testkit.profile import TestProfile

#: Writer threads in the race with a seal, and the writes each makes after the seal returned.
WRITERS = 4
REFUSED_AFTER_SEAL = 3


@pytest.fixture
def sealer(consensus_open_session: SessionFactory) -> Iterator[Backend]:
    """The backend of a session of its own, to seal the tested store with; unsealed at teardown."""
    backend = spi(consensus_open_session())
    yield backend
    backend.unseal()


def _refused(write: Callable[[], object]) -> None:
    with pytest.raises(SealedError):
        write()


def test_seal_refuses_every_write_of_every_session(
    sealer: Backend, consensus_open_session: SessionFactory, consensus_ns: str
) -> None:
    """Once seal() returns, put, update (with and without version), delete and fenced writes of another
    session and of the sealing one raise SealedError and change nothing; reads still work."""
    other = consensus_open_session()
    election = other.election(unique("ct-service"))
    assert election.nominate("c0")
    fence = election.leadership()
    assert fence is not None
    kept = other.storage.put(f"{consensus_ns}/kept", b"before")
    sealer.seal()
    storage = other.storage
    _refused(lambda: storage.put(f"{consensus_ns}/new", b"x"))
    _refused(lambda: storage.put(f"{consensus_ns}/new", b"x", fence=fence))
    _refused(lambda: storage.update(f"{consensus_ns}/kept", b"after"))
    _refused(lambda: storage.update(f"{consensus_ns}/kept", b"after", version=kept))
    _refused(lambda: storage.update(f"{consensus_ns}/kept", b"after", fence=fence))
    _refused(lambda: storage.delete(f"{consensus_ns}/kept"))
    _refused(lambda: storage.delete(f"{consensus_ns}/kept", version=kept))
    _refused(lambda: sealer.put(f"{consensus_ns}/own", b"x", None))
    _refused(lambda: sealer.update(f"{consensus_ns}/kept", b"own", None, None))
    _refused(lambda: sealer.delete(f"{consensus_ns}/kept", None, None))
    assert storage.fetch(f"{consensus_ns}/kept") == Versioned(b"before", kept)
    assert storage.fetch(f"{consensus_ns}/new") is None
    assert storage.keys(consensus_ns) == frozenset({f"{consensus_ns}/kept"})
    assert sealer.fetch(f"{consensus_ns}/own") is None


def test_sealed_store_keeps_members_and_elections(
    sealer: Backend, consensus_open_session: SessionFactory
) -> None:
    """A sealed store still takes members and candidates: joins, leaves, nominations, a hand-over to
    a higher term, and reads of both."""
    first, second = consensus_open_session(), consensus_open_session()
    group, service = unique("ct-group"), unique("ct-service")
    sealer.seal()
    first.group(group).join("m1", b"d1")
    second.group(group).join("m2", b"d2")
    assert first.group(group).membership() == {"m1": b"d1", "m2": b"d2"}
    second.group(group).leave("m2")
    assert first.group(group).members() == frozenset({"m1"})
    assert first.election(service).nominate("c1")
    assert not second.election(service).nominate("c2")
    before = first.election(service).leadership()
    assert before is not None and before.leader_id == "c1"
    first.election(service).resign("c1")

    def led_by_c2() -> Leadership | None:
        led = second.election(service).leadership()
        return led if led is not None and led.leader_id == "c2" else None

    after = wait_until(led_by_c2, EVENT_TIMEOUT, what="c2 leading after c1 resigned on a sealed store")
    assert after.term > before.term


def test_unseal_accepts_writes_again_and_sealed_tells_it(
    sealer: Backend, consensus_open_session: SessionFactory, consensus_ns: str
) -> None:
    """sealed() reflects seal and unseal in every session (linearizable); both are idempotent; after
    unseal every session writes again."""
    other = consensus_open_session()
    observer = spi(other)
    assert not observer.sealed() and not sealer.sealed()
    sealer.seal()
    sealer.seal()
    assert observer.sealed() and sealer.sealed()
    _refused(lambda: other.storage.put(f"{consensus_ns}/k", b"x"))
    sealer.unseal()
    sealer.unseal()
    assert not observer.sealed() and not sealer.sealed()
    version = other.storage.put(f"{consensus_ns}/k", b"x")
    assert sealer.put(f"{consensus_ns}/own", b"y", None) > 0
    assert other.storage.fetch(f"{consensus_ns}/k") == Versioned(b"x", version)


@dataclass(frozen=True)
class _Write:
    """One put of a fresh key: when it started and returned (``time.monotonic()``), and its version
    (None: refused with ``SealedError``)."""

    key: str
    started: float
    returned: float
    version: int | None


class _Writer(threading.Thread):
    """Puts fresh keys in a loop until stopped or refused often enough after the seal returned."""

    def __init__(self, session: Session, prefix: str, stop: threading.Event, sealed_at: list[float]) -> None:
        super().__init__(daemon=True)
        self._session, self._prefix, self._halt, self._sealed_at = session, prefix, stop, sealed_at
        self.writes: list[_Write] = []  # unknown outcomes (OperationTimeoutError) are left out
        self.failure: BaseException | None = None

    def refused_after_seal(self) -> int:
        return sum(
            w.version is None and bool(self._sealed_at) and w.started > self._sealed_at[0]
            for w in self.writes
        )

    def run(self) -> None:
        for count in itertools.count():
            if self._halt.is_set() or self.refused_after_seal() >= REFUSED_AFTER_SEAL:
                return
            key, started = f"{self._prefix}/{count}", time.monotonic()
            try:
                version: int | None = self._session.storage.put(key, key.encode())
            except SealedError:
                version = None
            except OperationTimeoutError:
                continue
            except ConsensusError as exc:
                self.failure = exc
                return
            self.writes.append(_Write(key, started, time.monotonic(), version))


def test_writes_racing_a_seal_are_applied_before_it_or_refused(
    sealer: Backend, consensus_open_session: SessionFactory, consensus_ns: str
) -> None:
    """Writers on several sessions put fresh keys while the store is sealed: every acknowledged write
    is there with its value and version, every refused one is absent, and no write started after
    seal() returned, or after another write was refused, is acknowledged (positive controls: every
    writer had writes acknowledged, and refused after the seal)."""
    stop = threading.Event()
    sealed_at: list[float] = []  # when seal() returned (time.monotonic())
    writers = [
        _Writer(consensus_open_session(), f"{consensus_ns}/w{index}", stop, sealed_at)
        for index in range(WRITERS)
    ]
    for writer in writers:
        writer.start()
    try:
        wait_until(
            lambda: all(len(writer.writes) >= 3 for writer in writers),
            EVENT_TIMEOUT,
            what="every writer to have writes acknowledged before the seal",
        )
        sealer.seal()
        sealed_at.append(time.monotonic())
        for writer in writers:
            writer.join(EVENT_TIMEOUT * 2)
    finally:
        stop.set()
    assert not any(writer.is_alive() for writer in writers), "a writer did not finish within its bound"
    assert [writer.failure for writer in writers] == [None] * WRITERS
    assert [writer.refused_after_seal() for writer in writers] == [REFUSED_AFTER_SEAL] * WRITERS
    writes = [write for writer in writers for write in writer.writes]
    first_refusal = min(write.returned for write in writes if write.version is None)
    late = [w for w in writes if w.version is not None and w.started > min(first_refusal, sealed_at[0])]
    assert late == [], "writes acknowledged though started after the seal took effect"
    reader = consensus_open_session().storage
    for write in writes:
        expected = None if write.version is None else Versioned(write.key.encode(), write.version)
        assert reader.fetch(write.key) == expected, write


def test_term_ceiling_covers_fresh_terms_and_tokens_and_never_decreases(
    consensus_open_session: SessionFactory,
) -> None:
    """term_ceiling() of any session is at least every term and lock token issued before it was asked,
    by any session, stays below 2**63, and never goes down, read by one session or another."""
    issuer, reader = consensus_open_session(), consensus_open_session()
    readings = [spi(reader).term_ceiling()]
    service = unique("ct-service")
    assert issuer.election(service).nominate("c0")
    leadership = issuer.election(service).leadership()
    assert leadership is not None
    readings.append(spi(reader).term_ceiling())
    assert readings[-1] >= leadership.term
    lock = issuer.lock(unique("ct-lock"))
    lease = lock.acquire(timeout=EVENT_TIMEOUT)
    assert lease is not None, "the lock was not acquired"
    try:
        readings += [spi(reader).term_ceiling(), spi(issuer).term_ceiling()]
        assert min(readings[-2:]) >= lease.token
    finally:
        lock.release()
    issuer.election(service).resign("c0")
    assert issuer.election(service).nominate("c0")
    renewed = issuer.election(service).leadership()
    assert renewed is not None and renewed.term > leadership.term
    readings += [spi(issuer).term_ceiling(), spi(reader).term_ceiling()]
    assert readings[-1] >= renewed.term
    assert all(isinstance(reading, int) and 0 <= reading < 2**63 for reading in readings)
    assert readings == sorted(readings), f"term_ceiling went down: {readings}"


def test_session_identity_is_stable_and_distinct(consensus_open_session: SessionFactory) -> None:
    """session_identity() is a non-empty string, the same at every call, different for two sessions."""
    first, second = spi(consensus_open_session()), spi(consensus_open_session())
    identity = first.session_identity()
    assert isinstance(identity, str) and identity
    assert first.session_identity() == identity
    assert second.session_identity() != identity


def test_live_sessions_is_none_only_where_the_profile_declares_it(
    consensus_session: Session, consensus_profile: TestProfile
) -> None:
    """A backend whose live_sessions() is None declares 'lists_sessions' not applicable in its test
    profile, with the reason (so the cut-over's --force is documented), and one that lists them does not."""
    listed = spi(consensus_session).live_sessions()
    declared = consensus_profile.reason_not_applicable({"lists_sessions"})
    if listed is None:
        assert declared is not None, (
            f"{consensus_profile.name}: live_sessions() is None, but its test profile does not declare "
            "'lists_sessions' not applicable"
        )
    else:
        assert declared is None, f"{consensus_profile.name} lists live sessions but declares: {declared}"
        assert spi(consensus_session).session_identity() in listed


@pytest.mark.lists_sessions
def test_live_sessions_lists_live_sessions_and_drops_a_closed_one(
    consensus_open_session: SessionFactory, consensus_profile: TestProfile
) -> None:
    """live_sessions() of a third session holds both sessions' identities; once one is closed its
    identity is gone within session_timeout plus the backend's detection delay, the other's stays."""
    observer = spi(consensus_open_session())
    kept, closing = consensus_open_session(), consensus_open_session()
    kept_id, closing_id = spi(kept).session_identity(), spi(closing).session_identity()

    def listed() -> frozenset[str]:
        sessions = observer.live_sessions()
        assert sessions is not None, "live_sessions() is None on a backend that declares it lists them"
        return sessions

    assert {kept_id, closing_id} <= listed()
    closing.close()
    session_timeout = observer.settings.session_timeout
    bound = session_timeout + consensus_profile.detection_delay(session_timeout) + 5
    wait_until(lambda: closing_id not in listed(), bound, what=f"{closing_id} gone from live_sessions()")
    assert kept_id in listed()
