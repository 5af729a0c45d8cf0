"""Writers racing a migration's seal, shared by the backends' seal tests (``test_*_seal.py``)."""

from __future__ import annotations

import threading
from collections.abc import Callable

import consensus_api as ca
from consensus_api import Versioned
from consensus_testkit.conformance.helpers import spi, wait_until

#: Writes refused after seal() returned that end a writer.
REFUSED_AFTER_SEAL = 3


def race_the_seal(sealing: ca.Session, writers: list[ca.Session], reader: Callable[[], ca.Session]) -> None:
    """Each writer puts fresh keys and updates a key of its own in a loop while ``sealing`` seals the
    store; then a session from ``reader`` finds every acknowledged write with its version and none of
    the refused ones, and no write begun after seal() returned was acknowledged (positive controls:
    every writer had some of each)."""
    puts: dict[str, int | None] = {}  # key -> version, or None: refused
    updates: dict[int, list[int | None]] = {index: [] for index in range(len(writers))}
    late: list[str] = []
    sealed = threading.Event()
    lock = threading.Lock()

    def write(session: ca.Session, index: int) -> None:
        session.storage.put(f"own/{index}", b"0")
        refused_after_seal = 0
        for count in range(5000):
            after_seal = sealed.is_set()
            key = f"race/{index}-{count}"
            try:
                version: int | None = session.storage.put(key, key.encode())
            except ca.SealedError:
                version = None
            try:
                updated: int | None = session.storage.update(f"own/{index}", key.encode())
            except ca.SealedError:
                updated = None
            with lock:
                puts[key] = version
                updates[index].append(updated)
                if after_seal and (version is not None or updated is not None):
                    late.append(key)
            refused_after_seal += after_seal and version is None
            if refused_after_seal == REFUSED_AFTER_SEAL:
                return

    threads = [threading.Thread(target=write, args=(session, i)) for i, session in enumerate(writers)]
    for thread in threads:
        thread.start()

    def acknowledged() -> int:
        with lock:
            return sum(version is not None for version in puts.values())

    wait_until(lambda: acknowledged() >= 3 * len(writers), 30, what="writes acknowledged before the seal")
    spi(sealing).seal()
    sealed.set()
    for thread in threads:
        thread.join(60)
    assert not any(thread.is_alive() for thread in threads)
    assert late == []
    storage = reader().storage
    for key, version in puts.items():
        assert storage.fetch(key) == (None if version is None else Versioned(key.encode(), version)), key
    for index, versions in updates.items():
        applied = [version for version in versions if version is not None]
        assert applied and None in versions
        last = storage.fetch(f"own/{index}")
        assert last is not None and last.version == applied[-1]
