"""The ``consensus`` command against real SQLite files (no mocks)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_support import assert_clean_error, run

import consensus_api as ca

CLI = [sys.executable, "-m", "consensus_api.cli"]


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'cli.db'}"


def test_kv_round_trip(url: str) -> None:
    put = run("kv", "put", "app/mode", "fast", "--url", url)
    assert put.exit_code == 0, put.output
    assert put.stdout == "version: 1\n"

    got = run("kv", "get", "app/mode", "--url", url)
    assert got.exit_code == 0 and got.stdout == "fast\n"

    updated = run("kv", "update", "app/mode", "slow", "--version", "1", "--url", url)
    assert updated.exit_code == 0, updated.output
    version = int(updated.stdout.removeprefix("version: "))
    assert version > 1

    with_version = run("kv", "get", "app/mode", "--version", "--url", url)
    assert with_version.stdout == f"slow\nversion: {version}\n"

    assert run("kv", "put", "app/blob", "-", "--url", url, input=b"\x00\xff raw").exit_code == 0
    assert run("kv", "get", "app/blob", "--url", url).stdout == "\\x00\\xff raw\n"  # escaped for a terminal
    assert run("kv", "get", "app/blob", "--raw", "--url", url).stdout_bytes == b"\x00\xff raw"
    assert run("kv", "put", "app/sub/deep", "x", "--url", url).exit_code == 0
    assert run("kv", "keys", "app", "--url", url).stdout.splitlines() == ["app/blob", "app/mode"]

    deleted = run("kv", "delete", "app/blob", "--version", "1", "--url", url)
    assert deleted.exit_code == 0, deleted.output
    assert run("kv", "keys", "app", "--url", url).stdout.splitlines() == ["app/mode"]


def test_contract_failures_exit_1(url: str) -> None:
    assert run("kv", "put", "k", "v", "--url", url).exit_code == 0
    assert_clean_error(run("kv", "get", "missing", "--url", url), 1, "no such key")
    assert_clean_error(run("kv", "put", "k", "again", "--create-only", "--url", url), 1, "already exists")
    assert_clean_error(run("kv", "put", "k", "again", "--if-version", "7", "--url", url), 1, "version")
    assert_clean_error(run("kv", "put", "missing", "v", "--if-version", "1", "--url", url), 1, "missing")
    assert_clean_error(run("kv", "update", "k", "v2", "--version", "7", "--url", url), 1, "version")
    assert_clean_error(run("kv", "update", "missing", "v", "--url", url), 1, "missing")
    assert_clean_error(run("kv", "delete", "k", "--version", "7", "--url", url), 1, "version")
    assert run("kv", "get", "k", "--url", url).stdout == "v\n"


def test_usage_and_configuration_errors_exit_2(url: str) -> None:
    assert run("kv", "put", "k", "v", "--url", url).exit_code == 0  # read-only commands need the database
    assert_clean_error(run("kv", "get", "k", "--url", "not a url"), 2, "malformed URL")
    assert_clean_error(run("kv", "get", "k", "--url", "nosuch://h/x"), 2, "no backend for the URL scheme")
    assert_clean_error(run("kv", "get", "k", "--url", url + "?bogus=1"), 2, "unknown option 'bogus'")
    assert_clean_error(run("kv", "get", "k", "--url", url + "?session_timeout=-1"), 2, "session_timeout")
    assert_clean_error(run("kv", "get", "a/../b", "--url", url), 2, "'..'")
    assert_clean_error(run("kv", "get", "k", "--url", "$CONSENSUS_NO_SUCH_VAR"), 2, "is not set")
    assert run("kv", "get", "k", "--no-such-flag").exit_code == 2
    assert run("kv", "frobnicate").exit_code == 2
    assert run("watch", "k", "--namespace", "ns", "--url", url).exit_code == 2


def test_unreachable_backend_exits_2_without_password() -> None:
    result = run("kv", "get", "k", "--url", "postgresql://user:s3cret@127.0.0.1:1/db?connect_timeout=1")
    assert_clean_error(result, 2, "127.0.0.1")
    assert "s3cret" not in result.output


def test_url_from_environment(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CONSENSUS_URL", url)
    assert run("kv", "put", "env/k", "v").exit_code == 0
    assert run("kv", "get", "env/k", "--url", "$CONSENSUS_URL").stdout == "v\n"
    with ca.connect(url) as session:
        fetched = session.storage.fetch("env/k")
    assert fetched is not None and fetched.value == b"v"


@pytest.fixture
def writer(url: str) -> Iterator[threading.Event]:
    """Update ``watched/k`` every 0.3 s from another session until the test ends."""
    stop, ready = threading.Event(), threading.Event()

    def write() -> None:
        with ca.connect(url) as session:
            session.storage.put("watched/k", b"0")
            ready.set()
            number = 0
            while not stop.wait(0.3):
                number += 1
                session.storage.update("watched/k", str(number).encode())

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    assert ready.wait(10)
    yield stop
    stop.set()
    thread.join(10)


def test_watch_count(url: str, writer: threading.Event) -> None:
    result = run("watch", "watched/k", "--count", "3", "--timeout", "30", "--url", url)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert len(lines) == 3, lines
    versions = [int(m[1]) for line in lines if (m := re.match(r"watched/k version=(\d+) value=", line))]
    assert len(versions) == 3 and versions == sorted(set(versions)), lines

    as_json = run("watch", "watched/k", "--count", "2", "--json", "--timeout", "30", "--url", url)
    events = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert [e["type"] for e in events] == ["value", "value"] and events[0]["version"] < events[1]["version"]
    assert all(e["encoding"] == "utf-8" and e["value"].isdigit() for e in events), events


def test_watch_namespace_timeout(url: str) -> None:
    assert run("kv", "put", "ns/a", "1", "--url", url).exit_code == 0
    result = run("watch", "--namespace", "ns", "--timeout", "1", "--url", url)
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == ['ns keys=["ns/a"]']


def test_members_and_leader(url: str) -> None:
    ca.connect(url).close()  # read-only commands need the database
    assert run("members", "team", "--url", url).stdout == "no members in team\n"
    assert run("leader", "svc", "--url", url).stdout == "no leader\n"
    with ca.connect(url) as session:
        session.group("team").join("alice", b"host=a")
        session.group("team").join("bob", b"host=b")
        assert session.election("svc").nominate("alice")
        leadership = session.election("svc").leadership()
        assert leadership is not None
        term = leadership.term
        members = run("members", "team", "--url", url)
        assert members.exit_code == 0, members.output
        rows = [line for line in members.stdout.splitlines() if "alice" in line or "bob" in line]
        assert len(rows) == 2 and "host=a" in rows[0] and "host=b" in rows[1]
        assert run("leader", "svc", "--url", url).stdout == f"leader: alice term: {term}\n"
    assert run("leader", "svc", "--url", url).stdout == "no leader\n"


def test_servers_run_sqlite_passes_url_and_status() -> None:
    script = (
        "import os, sys, consensus_api as ca\n"
        "url = os.environ['CONSENSUS_URL']\n"
        "assert url == os.environ['CONSENSUS_SQLITE_URL'] == sys.argv[1], (url, sys.argv)\n"
        "with ca.connect(url) as s: s.storage.put('from/child', b'1')\n"
        "print(url)\n"
        "sys.exit(7)\n"
    )
    proc = subprocess.run(
        [*CLI, "servers", "run", "sqlite", "--", sys.executable, "-c", script, "$CONSENSUS_URL"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 7, proc.stderr
    child_url = proc.stdout.strip()
    assert re.fullmatch(r"sqlite:////.+/consensus\.db", child_url), proc.stdout
    assert not Path(child_url.removeprefix("sqlite:///")).parent.exists()  # cleaned up

    ok = subprocess.run(
        [*CLI, "servers", "run", "sqlite", "--", sys.executable, "-c", "pass"],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert ok.returncode == 0, ok.stderr


def test_servers_run_usage_errors() -> None:
    assert run("servers", "run", "sqlite").exit_code == 2
    assert run("servers", "run", "mysql", "--", "true").exit_code == 2
    assert run("servers", "run", "sqlite", "sqlite", "--", "true").exit_code == 2


def _processes_mentioning(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and entry.name != str(os.getpid()):
            try:
                if text.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def test_demo_shows_handover_with_higher_term(tmp_path: Path) -> None:
    demo_url = f"sqlite:///{tmp_path / 'demo.db'}"
    proc = subprocess.run(
        [*CLI, "demo", "--url", demo_url, "--kill-after", "3", "--duration", "25"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    match = re.search(
        r"^hand-over: (w\d) \(term (\d+)\) -> (w\d) \(term (\d+)\) in ([\d.]+) s$", proc.stdout, re.MULTILINE
    )
    assert match, proc.stdout
    assert match[1] != match[3] and int(match[4]) > int(match[2])
    assert "SIGKILL leader" in proc.stdout
    assert not _processes_mentioning(str(tmp_path)), "demo workers left running"
