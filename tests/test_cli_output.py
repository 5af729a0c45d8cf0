"""The ``consensus`` command's output: ``--json``, ``--recursive``, escaping of stored bytes, ``ping``
and missing extras, against real SQLite files and servers (no mocks)."""

from __future__ import annotations

import base64
import json
import re
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cli_support import assert_clean_error, run
from click.testing import Result

import consensus_api as ca
from consensus_testkit import ServerHandle


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'cli.db'}"


ESC_DATA = "\x1b[2Jwiped\x00[bold red]markup[/]\x9b".encode()  # ESC, NUL, rich markup, CSI (C1)


def parse_json(result: Result) -> object:
    """The one JSON document a command printed (stdout holds nothing else)."""
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def assert_no_raw_controls(text: str) -> None:
    assert not re.search("[\x00-\x08\x0b-\x1f\x7f-\x9f]", text), repr(text)


def test_kv_json_and_recursive_keys(url: str) -> None:
    with ca.connect(url) as session:
        session.storage.put("app/mode", b"fast")
        session.storage.put("app/blob", b"\x00\xff\x1b")
        session.storage.put("app/sub/deep", b"x")
        session.storage.put("other", b"y")

    text = parse_json(run("kv", "get", "app/mode", "--json", "--url", url))
    assert text == {"key": "app/mode", "version": 1, "value": "fast", "encoding": "utf-8"}
    binary = parse_json(run("kv", "get", "app/blob", "--json", "--url", url))
    assert isinstance(binary, dict) and binary["encoding"] == "base64"
    assert base64.b64decode(binary["value"]) == b"\x00\xff\x1b"
    assert run("kv", "get", "missing", "--json", "--url", url).stdout == ""
    assert run("kv", "get", "app/mode", "--raw", "--json", "--url", url).exit_code == 2

    assert parse_json(run("kv", "keys", "app", "--json", "--url", url)) == {
        "namespace": "app",
        "recursive": False,
        "keys": ["app/blob", "app/mode"],
    }
    everything = parse_json(run("kv", "keys", "--recursive", "--json", "--url", url))
    assert everything == {
        "namespace": "",
        "recursive": True,
        "keys": ["app/blob", "app/mode", "app/sub/deep", "other"],
    }
    below = run("kv", "keys", "app", "-r", "--url", url)
    assert below.stdout.splitlines() == ["app/blob", "app/mode", "app/sub/deep"]


def test_members_and_leader_json(url: str) -> None:
    ca.connect(url).close()  # read-only commands need the database
    assert parse_json(run("members", "team", "--json", "--url", url)) == {"group": "team", "members": []}
    assert parse_json(run("leader", "svc", "--json", "--url", url)) == {
        "service": "svc",
        "leader": None,
        "term": None,
    }
    with ca.connect(url) as session:
        session.group("team").join("bob", b"\xff\xfe")
        session.group("team").join("alice", ESC_DATA)
        assert session.election("svc").nominate("alice")
        leadership = session.election("svc").leadership()
        assert leadership is not None
        members = run("members", "team", "--json", "--url", url)
        assert_no_raw_controls(members.stdout)  # JSON escapes ESC, NUL and C1 as \u....
        assert parse_json(members) == {
            "group": "team",
            "members": [
                {"member": "alice", "data": ESC_DATA.decode(), "encoding": "utf-8"},
                {"member": "bob", "data": base64.b64encode(b"\xff\xfe").decode(), "encoding": "base64"},
            ],
        }
        assert parse_json(run("leader", "svc", "--json", "--url", url)) == {
            "service": "svc",
            "leader": "alice",
            "term": leadership.term,
        }


def test_control_characters_never_reach_the_terminal(url: str) -> None:
    with ca.connect(url) as session:
        session.storage.put("esc/value", ESC_DATA)
        session.storage.put("esc/plain", b"x")
        session.group("team").join("alice", ESC_DATA)
        session.group("team").join("bob", b"ok")
        # Another writer (a tool or an older client) stored a key and a member id with ESC and
        # NUL, which the API itself refuses: the CLI must still show them safely.
        with sqlite3.connect(url.removeprefix("sqlite:///")) as db:
            db.execute("UPDATE consensus_kv SET key = ? WHERE key = 'esc/plain'", ("esc/\x1b[31mred\x00",))
            db.execute(
                "UPDATE consensus_members SET member_id = ? WHERE member_id = 'bob'", ("b\x1b]0;t\x07",)
            )

        value = run("kv", "get", "esc/value", "--url", url)
        members = run("members", "team", "--url", url)
        keys = run("kv", "keys", "esc", "--url", url)
        watched = run("watch", "esc/value", "--count", "1", "--timeout", "30", "--url", url)
    for result in (value, members, keys, watched):
        assert result.exit_code == 0, result.output
        assert_no_raw_controls(result.stdout)
    assert value.stdout == "\\x1b[2Jwiped\\x00[bold red]markup[/]\\x9b\n"
    assert "\\x1b[2Jwiped\\x00[bold red]markup[/]\\x9b" in members.stdout  # rich markup not applied
    assert "b\\x1b]0;t\\x07" in members.stdout
    assert keys.stdout.splitlines() == ["esc/\\x1b[31mred\\x00", "esc/value"]
    assert "\\u001b[2Jwiped\\u0000[bold red]markup[/]\\u009b" in watched.stdout


def test_ping_sqlite(url: str) -> None:
    ca.connect(url).close()  # ping never creates the database
    human = run("ping", url)
    assert human.exit_code == 0, human.output
    assert re.fullmatch(
        rf"{re.escape(url)}: ok, sqlite 3\.\d+\.\d+, connect [\d.]+ ms, linearizable read [\d.]+ ms\n",
        human.stdout,
    ), human.stdout
    report = parse_json(run("ping", url, "--json"))
    assert isinstance(report, dict)
    assert set(report) == {"url", "backend", "server_version", "connect_ms", "read_ms"}
    assert report["backend"] == "sqlite" and re.fullmatch(r"3\.\d+\.\d+", report["server_version"])
    assert report["connect_ms"] > 0 and report["read_ms"] > 0


@pytest.mark.parametrize(
    "unreachable",
    ["postgresql://user:s3cret@127.0.0.1:1/db?connect_timeout=1", "etcd://127.0.0.1:1/app?connect_timeout=1"],
)
def test_ping_unreachable_exits_2_within_connect_timeout(unreachable: str) -> None:
    began = time.monotonic()
    result = run("ping", unreachable, "--json")
    assert_clean_error(result, 2, "127.0.0.1:1")
    assert time.monotonic() - began < 10
    assert result.stdout == "" and "s3cret" not in result.output


@pytest.mark.parametrize("server", ["postgresql_server", "zookeeper_server", "etcd_server"])
def test_ping_reports_the_server_version(server: str, request: pytest.FixtureRequest) -> None:
    handle: ServerHandle = request.getfixturevalue(server)
    report = parse_json(run("ping", handle.url, "--json"))
    assert isinstance(report, dict) and report["backend"] == server.removesuffix("_server")
    assert re.fullmatch(r"\d+\.\d+(\.\d+)?", report["server_version"] or ""), report


BLOCKED_IMPORTS = (
    "import sys\n"
    "for name in sys.argv[1].split(','):\n"
    "    sys.modules[name] = None  # makes the package impossible to import, as if not installed\n"
    "from consensus_api.cli import cli\n"
    "cli(sys.argv[2:])\n"
)


@pytest.mark.parametrize(
    ("blocked", "args", "message"),
    [
        ("pyarrow", ["chaos", "{url}", "--duration", "60", "--out", "{tmp}"], "consensus-api[chaos]"),
        ("pyspark", ["check", "{tmp}"], "consensus-api[spark]"),
        ("pyarrow", ["check", "{tmp}", "--engine", "local"], "consensus-api[chaos]"),
        (
            "psycopg",
            ["kv", "get", "k", "--url", "postgresql://u@127.0.0.1:1/db"],
            "consensus-api[postgresql]",
        ),
    ],
)
def test_missing_extra_exits_2_before_any_work(
    blocked: str, args: list[str], message: str, url: str, tmp_path: Path
) -> None:
    command = [arg.format(url=url, tmp=tmp_path) for arg in args]
    began = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", BLOCKED_IMPORTS, blocked, *command],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and blocked in proc.stderr and "Traceback" not in proc.stderr
    assert time.monotonic() - began < 30  # the 60 s chaos workload never ran
    assert list(tmp_path.iterdir()) == []  # nothing recorded, nothing created
