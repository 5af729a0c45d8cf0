"""The ``consensus`` command's conventions, as etcdctl's users expect them: ``--url`` before the
command, ``kv put`` that overwrites, read-only commands that create nothing, ``watch`` that tells an
absent key from a deleted one, and a SQLite file that can never be used failing at once (real SQLite
files, no mocks)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from cli_support import assert_clean_error, run


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'cli.db'}"


def test_url_before_the_command_and_put_overwrites(url: str) -> None:
    """As etcdctl: the endpoint once before the command, and ``put`` creates or overwrites."""
    first = run("--url", url, "kv", "put", "k", "v")
    assert first.exit_code == 0 and first.stdout == "version: 1\n", first.output
    second = run("--url", url, "kv", "put", "k", "v2")
    assert second.exit_code == 0, second.output
    version = int(second.stdout.removeprefix("version: "))
    assert version > 1
    assert run("--url", url, "kv", "get", "k").stdout == "v2\n"
    assert_clean_error(run("--url", url, "kv", "put", "k", "v3", "--create-only"), 1, "already exists")
    conditional = run("--url", url, "kv", "put", "k", "v3", "--if-version", str(version))
    assert conditional.exit_code == 0, conditional.output
    assert run("--url", url, "kv", "put", "k", "x", "--create-only", "--if-version", "1").exit_code == 2
    assert run("--url", url, "kv", "get", "k").stdout == "v3\n"
    # the URL after the command wins; both places reach every command that takes one
    assert run("--url", "sqlite:///nowhere-else.db", "kv", "get", "k", "--url", url).stdout == "v3\n"
    assert run("--url", url, "leader", "svc").stdout == "no leader\n"
    assert run("--url", url, "ping").exit_code == 0


def test_read_only_commands_never_create_a_database(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CONSENSUS_URL", raising=False)
    monkeypatch.delenv("CONSENSUS_CONFIG", raising=False)
    missing = f"sqlite:///{tmp_path / 'missing.db'}"
    for args in (
        ["members", "workers"],
        ["leader", "svc"],
        ["kv", "get", "k"],
        ["kv", "keys"],
        ["group", "describe", "g"],
        ["watch", "k", "--timeout", "1"],
        ["ping"],
        ["--url", missing, "kv", "get", "k"],
        ["ping", missing],
    ):
        assert_clean_error(run(*args), 2, "a read-only command does not create one")
    assert list(tmp_path.iterdir()) == []


def test_watch_tells_absent_from_deleted(url: str) -> None:
    assert run("kv", "put", "other", "x", "--url", url).exit_code == 0  # the database exists
    result = run("watch", "config/mode", "--count", "1", "--timeout", "30", "--url", url)
    assert result.exit_code == 0 and result.stdout == "config/mode absent\n", result.output


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda base: base / "no" / "such" / "dir" / "x.db", "there is no directory"),
        (lambda base: base, "is a directory"),
        (lambda base: base / "garbage.db", "is not a SQLite database"),
    ],
    ids=["missing-directory", "directory", "not-a-database"],
)
def test_permanent_sqlite_errors_fail_at_once(
    tmp_path: Path, make: Callable[[Path], Path], message: str
) -> None:
    (tmp_path / "garbage.db").write_bytes(b"not a database at all\n")
    began = time.monotonic()
    result = run("kv", "put", "k", "v", "--url", f"sqlite:///{make(tmp_path)}?connect_timeout=30")
    assert_clean_error(result, 2, message)
    assert time.monotonic() - began < 10  # not after connect_timeout
