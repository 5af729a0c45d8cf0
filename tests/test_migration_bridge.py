"""The bridged migration on SQLite -> SQLite (two files): the bridge, the cut-over, the roll-back, status.

Contract: docs/spec.md section 14 and docs/migration.md; the real pair: test_migration_bridge_real.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from bridge_support import (
    WAIT,
    bridge_of,
    cut_over_with_a_leader_a_lock_and_a_member,
    wait_for,
    write_waits_for_authority,
)

import consensus_api as ca
from consensus_api.floor import FLOOR_KEY
from consensus_api.marker import CUTOVER, NEW, Marker
from consensus_api.migrate import (
    CutoverRefusedError,
    RollbackRefusedError,
    cutover,
    migrate,
    rollback,
    status,
)
from consensus_api.migrate.stores import opened


@pytest.fixture
def pair(tmp_path: Path) -> tuple[str, str]:
    """An old and a new SQLite store."""
    return f"sqlite:///{tmp_path}/old.db", f"sqlite:///{tmp_path}/new.db"


def test_a_bridged_session_moves_leader_lock_and_member_at_the_cut_over(pair: tuple[str, str]) -> None:
    cut_over_with_a_leader_a_lock_and_a_member(*pair)


def test_the_cut_over_refuses_an_unbridged_session_and_seals_nothing(pair: tuple[str, str]) -> None:
    old, new = pair
    with ca.connect(old) as plain, ca.connect(old, migrate_to=new):
        plain.storage.put("k", b"v")
        migrate(old, new)
        with pytest.raises(CutoverRefusedError, match="1 live sessions on the old store are not bridged"):
            cutover(old, new, timeout=WAIT)
        assert plain.storage.put("still-writable", b"x") >= 1
        found = status(old, new)
        assert found.phase == "not-started"
        assert found.unbridged is not None
        assert len(found.unbridged) == 1
        assert len(found.bridged_old) == 1


def test_the_cut_over_refuses_data_out_of_sync(pair: tuple[str, str]) -> None:
    old, new = pair
    with ca.connect(old, migrate_to=new) as session:
        session.storage.put("a", b"1")
        session.storage.put("b", b"2")
        with pytest.raises(CutoverRefusedError, match="not in sync: 2 keys differ"):
            cutover(old, new, max_lag=1, timeout=WAIT)
        assert status(old, new).lag == 2
        assert bridge_of(session).authority == "old"


def test_an_unfenced_write_caught_by_the_seal_lands_on_the_new_store(pair: tuple[str, str]) -> None:
    old, new = pair
    with (
        ca.connect(old, migrate_to=new, request_timeout=30) as session,
        opened(old, new, None) as (_, old_store, new_store),
    ):
        marker = Marker("m1", CUTOVER, "old", new, 0.0, 0.0)
        old_store.write_marker(marker)
        old_store.backend.seal()
        write_waits_for_authority(session, lambda: new_store.write_marker(marker.moved(authority=NEW)))
        assert new_store.backend.fetch("late") is not None
        assert old_store.backend.fetch("late") is None


def test_rollback_returns_authority_and_keeps_tokens_rising(pair: tuple[str, str]) -> None:
    old, new = pair
    with ca.connect(old, migrate_to=new) as session:
        session.storage.put("k", b"v")
        election = session.election("svc")
        election.nominate("c1")
        migrate(old, new)
        cutover(old, new, timeout=WAIT)
        wait_for(lambda: bridge_of(session).authority == "new")
        on_new = wait_for(election.leadership)
        marker = rollback(old, new)
        assert marker.phase == "rolled-back"
        wait_for(lambda: bridge_of(session).authority == "old")
        back = wait_for(lambda: (found := election.leadership()) and found.term > on_new.term and found)
        assert back.leader_id == "c1"
        assert session.storage.update("k", b"after") >= 1
        found = status(old, new)
        assert (found.phase, found.authority, found.sealed_old) == ("rolled-back", "old", False)
        assert found.floor_old >= on_new.term


def test_rollback_is_refused_once_the_new_store_accepted_a_write(pair: tuple[str, str]) -> None:
    old, new = pair
    with ca.connect(old, migrate_to=new) as session:
        session.storage.put("k", b"v")
        migrate(old, new)
        cutover(old, new, timeout=WAIT)
        wait_for(lambda: bridge_of(session).authority == "new")
        session.storage.update("k", b"written on new")
        with pytest.raises(RollbackRefusedError, match="accepted writes since the cut-over"):
            rollback(old, new)
        assert session.storage.update("k", b"still writable") >= 1
        assert status(old, new).phase == "cut-over"


def test_migrate_to_from_the_environment_and_bad_targets(
    pair: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    old, new = pair
    monkeypatch.setenv("CONSENSUS_URL", old)
    monkeypatch.setenv("CONSENSUS_MIGRATE_TO", new)
    with ca.connect() as session:
        assert bridge_of(session).authority == "old"
    with ca.connect(old) as explicit:
        assert not hasattr(explicit._backend, "authority")
    with pytest.raises(ca.ConfigurationError):
        ca.connect(old, migrate_to=old)
    with pytest.raises(ca.ConfigurationError):
        ca.connect(old, migrate_to="nosuch://x")
    with pytest.raises(ca.ConfigurationError):
        cutover(old, new, timeout=-1)
    with pytest.raises(ca.ConfigurationError):
        status(old, old)


def test_the_floor_and_marker_are_never_copied(pair: tuple[str, str]) -> None:
    old, new = pair
    with ca.connect(old, migrate_to=new) as session:
        session.storage.put("k", b"v")
        migrate(old, new)
        cutover(old, new, timeout=WAIT)
    with ca.connect(old) as plain_old:
        assert plain_old.storage.fetch(FLOOR_KEY) is None
    assert not migrate(old, new, verify=True).differences


def test_the_cli_reports_status_refuses_and_cuts_over(pair: tuple[str, str]) -> None:
    """One session per process here: the SQL backend's file check at open drops the SQLite locks of
    other connections to the file in the same process (see the report of issue 39)."""
    old, new = pair
    stores_given = ["--from", old, "--to", new]
    with ca.connect(old) as plain:
        plain.storage.put("k", b"v")
        refused = _cli("migrate", "cutover", *stores_given, "--max-lag", "0")
        assert refused.returncode == 1
        assert "not bridged" in refused.stderr
    assert _cli("migrate", *stores_given).returncode == 0
    found = json.loads(_cli("migrate", "status", *stores_given, "--json").stdout)
    assert (found["phase"], found["lag"], found["unbridged"]) == ("not-started", 0, [])
    assert _cli("migrate", "cutover", *stores_given).returncode == 0
    table = _cli("migrate", "status", *stores_given).stdout
    assert "phase: cut-over" in table
    assert _cli("migrate", "rollback", *stores_given).returncode == 0
    assert _cli("migrate", "--from", old, "status", "--to", new).returncode == 2


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "consensus_api.cli", *args],
        capture_output=True,
        text=True,
        timeout=WAIT,
        check=False,
    )


def test_the_old_leader_leads_again_and_late_sessions_start_on_the_new_store(pair: tuple[str, str]) -> None:
    """The head of the old queue leads on the new store although its session is not the first to
    move; a bridged session opened after the cut-over starts on the new store."""
    old, new = pair
    with ca.connect(old, migrate_to=new) as waiting, ca.connect(old, migrate_to=new) as leading:
        assert leading.election("svc").nominate("head")
        assert not waiting.election("svc").nominate("next")
        before = leading.election("svc").leadership()
        assert before is not None
        migrate(old, new)
        cutover(old, new, timeout=WAIT)
        wait_for(lambda: bridge_of(waiting).authority == bridge_of(leading).authority == "new")
        after = wait_for(
            lambda: (found := waiting.election("svc").leadership()) and found.term > before.term and found
        )
        assert after.leader_id == "head"
        with ca.connect(old, migrate_to=new) as late:
            assert bridge_of(late).authority == "new"
            assert late.storage.put("late", b"x") >= 1
        with ca.connect(new) as plain_new:
            assert plain_new.storage.fetch("late") is not None
