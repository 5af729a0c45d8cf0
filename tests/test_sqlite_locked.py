"""SQLite with its write lock held by a frozen process (docs/guarantees.md): every entry point that
must write says so the same way, naming the process, and ``consensus ping`` reports it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from cli_support import run

import consensus_api as ca
from consensus_api import BackendUnavailableError, OperationTimeoutError
from consensus_testkit.conformance.worker import WorkerProcess


def test_every_entry_point_names_the_frozen_holder_of_the_write_lock(tmp_path: Path) -> None:
    """connect, acquire, nominate, join and put each fail naming the process that holds the write
    lock, in one phrase; ``consensus ping`` exits 2 with it; once the holder is gone, all succeed."""
    url = f"sqlite:///{tmp_path / 'locked.db'}"
    fast = {"request_timeout": 0.5, "connect_timeout": 1}
    with ca.connect(url, session_timeout=30, **fast) as session:
        session.storage.put("k", b"v")
        holder = WorkerProcess(url, "sqlite-lock", ["--hold", "60"], {})
        try:
            holder.expect("READY", 30)
            holder.pause()  # frozen with the write lock, as inside a write
            phrase = f"database is locked; its write lock is held by process {holder.pid}"
            calls: dict[str, Callable[[], object]] = {
                "acquire": lambda: session.lock("jobs").acquire(timeout=5),
                "nominate": lambda: session.election("service").nominate("candidate"),
                "join": lambda: session.group("group").join("member"),
                "put": lambda: session.storage.put("blocked", b"x"),
            }
            for name, call in calls.items():
                with pytest.raises(OperationTimeoutError) as refused:
                    call()
                assert phrase in str(refused.value), (name, refused.value)
            with pytest.raises(BackendUnavailableError) as unavailable:
                ca.connect(url, **fast)
            assert phrase in str(unavailable.value)
            pinged = run("ping", f"{url}?connect_timeout=1&request_timeout=0.5")
            assert pinged.exit_code == 2, pinged.output
            assert phrase in pinged.stderr.replace("\n", " ")
        finally:
            holder.resume()
            holder.close()
        assert session.election("service").nominate("candidate")
        assert run("ping", url).exit_code == 0
