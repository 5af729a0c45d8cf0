"""``consensus conformance``: its counts, its JSON summary and report file, and its exit status when a
fixture, a test body or pytest itself fails, or the run is interrupted (on SQLite files; no mocks: the
failures are planted by a pytest plugin the run loads through ``PYTEST_PLUGINS``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from cli_support import CLI, assert_clean_error, run

from consensus_testkit.cli.conformance import REPORT_VARIABLE, section_of

#: Two quick tests of the storage section, run in this order.
FIRST = "test_fetch_missing_key_returns_none"
SECOND = "test_put_returns_version_and_fetch_returns_it"


def listed(entries: list[dict[str, str]]) -> list[tuple[str, str]]:
    """(test name, message) of each entry of a report's list of tests."""
    return [(entry["test"].rpartition("::")[2], entry["message"]) for entry in entries]


def planted_run(
    tmp_path: Path, plugin: str, *args: str
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """``consensus conformance`` on a fresh SQLite file, FIRST and SECOND only, with ``plugin`` (a pytest
    plugin's source) loaded into its pytest; the process and the JSON report it wrote."""
    (tmp_path / "planted.py").write_text(plugin)
    report = tmp_path / "report.json"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])),
        "PYTEST_PLUGINS": "planted",
        REPORT_VARIABLE: str(report),
    }
    proc = subprocess.run(
        [*CLI, "conformance", f"sqlite:///{tmp_path / 'c.db'}", "-k", f"{FIRST} or {SECOND}", *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=env,
        cwd=tmp_path,
    )
    return proc, json.loads(report.read_text())


FIXTURE_AND_BODY_FAIL = f"""
import pytest

@pytest.fixture
def consensus_ns(consensus_ns, request):  # overrides the suite's fixture, which it wraps
    if request.node.name == "{FIRST}":
        pytest.fail("planted in the consensus_ns fixture")
    return consensus_ns

@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item):
    if item.name == "{SECOND}":
        pytest.fail("planted in the test body")
"""


def test_a_failing_fixture_is_an_error_and_a_failing_body_a_failure(tmp_path: Path) -> None:
    proc, report = planted_run(tmp_path, FIXTURE_AND_BODY_FAIL)
    assert proc.returncode == 1, proc.stderr
    assert listed(report["errors"]) == [(FIRST, "Failed: planted in the consensus_ns fixture")]
    assert listed(report["failures"]) == [(SECOND, "Failed: planted in the test body")]
    assert (report["passed"], report["failed"], report["skipped"]) == (0, 2, 0)
    assert report["pytest_exit_code"] == 1 and report["url"] == f"sqlite:///{tmp_path / 'c.db'}"
    # the table's run (no --json) names both, as pytest does
    assert f"ERROR {report['errors'][0]['test']} - Failed: planted" in proc.stdout
    assert f"FAILED {report['failures'][0]['test']} - Failed: planted" in proc.stdout


INTERRUPT_IN_SECOND = f"""
import os, signal, time

def pytest_runtest_call(item):
    if item.name == "{SECOND}":
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C
        time.sleep(30)
"""


def test_an_interrupted_run_exits_2_with_the_counts_so_far(tmp_path: Path) -> None:
    proc, report = planted_run(tmp_path, INTERRUPT_IN_SECOND, "--json")
    assert proc.returncode == 2, proc.stderr
    assert json.loads(proc.stdout) == report  # --json prints what the report file holds
    assert report["pytest_exit_code"] == 2 and report["passed"] == 1
    assert "1 conformance tests ran (interrupted)" in proc.stderr


INTERNAL_ERROR_IN_SECOND = f"""
def pytest_runtest_logreport(report):
    if report.when == "call" and report.nodeid.endswith("{SECOND}"):
        raise RuntimeError("planted in a reporting hook")
"""


def test_an_internal_error_part_way_exits_3(tmp_path: Path) -> None:
    proc, report = planted_run(tmp_path, INTERNAL_ERROR_IN_SECOND)
    assert proc.returncode == 3, proc.stderr
    assert report["pytest_exit_code"] == 3 and report["passed"] >= 1
    assert "INTERNALERROR" in proc.stdout + proc.stderr
    assert "(pytest exit code 3)" in proc.stderr


def test_section_of() -> None:
    assert section_of("consensus_testkit/conformance/test_storage.py::test_put[x/y]") == "storage"
    assert section_of("test_errors.py::TestX::test_y") == "errors"
    assert section_of("consensus_testkit/conformance/test_faults_netns.py::test_x") == "faults"


COLLECTED = """
import pytest

@pytest.fixture
def broken():
    raise RuntimeError("setup fails")

def test_ok():
    pass

def test_fails():
    assert 1 == 2

def test_skips():
    pytest.skip("not here")

def test_setup_error(broken):
    pass
"""


def test_collector_counts_sections_on_a_real_pytest_run(tmp_path: Path) -> None:
    (tmp_path / "test_alpha.py").write_text(COLLECTED)
    (tmp_path / "test_beta.py").write_text("def test_ok():\n    pass\n")
    (tmp_path / "test_gamma.py").write_text("import no_such_module_anywhere\n")
    script = (
        "import json, sys, pytest\n"
        "from consensus_testkit.cli.conformance import Collector\n"
        "c = Collector()\n"
        "pytest.main([sys.argv[1], '-q', '-p', 'no:cacheprovider', '--continue-on-collection-errors'],"
        " plugins=[c])\n"
        "print(json.dumps({'sections': {n: [s.passed, s.failed, s.skipped] for n, s in c.sections().items()},"
        " 'failed': c.failed_ids()}), file=sys.stderr)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
    )
    result = json.loads(proc.stderr.strip().splitlines()[-1])
    assert result["sections"] == {"alpha": [1, 2, 1], "beta": [1, 0, 0], "gamma": [0, 1, 0]}
    assert sorted(result["failed"]) == [
        "test_alpha.py::test_fails",
        "test_alpha.py::test_setup_error",
        "test_gamma.py",
    ]


def test_conformance_json_on_sqlite(tmp_path: Path) -> None:
    env = {**os.environ, "CONSENSUS_URL": f"sqlite:///{tmp_path / 'conformance.db'}"}
    proc = subprocess.run(
        [*CLI, "conformance", "$CONSENSUS_URL", "--json"],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        env=env,
        cwd=tmp_path,
    )
    summary = json.loads(proc.stdout)  # stdout holds the JSON and nothing else
    assert set(summary) == {
        "backend",
        "url",
        "passed",
        "failed",
        "skipped",
        "pytest_exit_code",
        "failures",
        "errors",
        "skips",
        "not_applicable",
        "sections",
    }
    assert summary["backend"] == "sqlite" and summary["url"] == env["CONSENSUS_URL"]
    assert summary["passed"] > 0 and summary["pytest_exit_code"] in (0, 1)
    failed = {entry["test"] for entry in summary["failures"] + summary["errors"]}
    assert len(failed) == summary["failed"] and len(summary["skips"]) == summary["skipped"]
    for counts in summary["sections"].values():
        assert set(counts) == {"passed", "failed", "skipped", "not_applicable", "seconds"}
    for kind in ("passed", "failed", "skipped"):
        assert summary[kind] == sum(counts[kind] for counts in summary["sections"].values())
    # tests that need a server process, and the security section, are not collected for SQLite: its
    # profile says why
    faults, security = summary["sections"]["faults"], summary["sections"]["security"]
    not_applicable = sum(counts["not_applicable"] for counts in summary["sections"].values())
    assert faults["passed"] > 0 and faults["not_applicable"] > 0
    assert security["passed"] == 0 and security["not_applicable"] > 0
    assert not_applicable == len(summary["not_applicable"])
    assert {entry["reason"] for entry in summary["not_applicable"]} == {
        "SQLite has no server process",
        "SQLite has no server, so no TLS or passwords",
        "a process frozen inside a write holds SQLite's file lock: writers wait for it",
        "SQLite is a file, not a replicated cluster",
    }
    assert all(entry["test"].split("::")[0].endswith(".py") for entry in summary["not_applicable"])
    assert proc.returncode == (0 if summary["failed"] == summary["skipped"] == 0 else 1), proc.stderr


def test_conformance_errors(tmp_path: Path) -> None:
    assert_clean_error(run("conformance", "sqlite:///x.db?bogus=1"), 2, "unknown option")
    nothing = subprocess.run(
        [*CLI, "conformance", f"sqlite:///{tmp_path / 'c.db'}", "--json", "-k", "no_test_is_named_like_this"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=tmp_path,
    )
    assert nothing.returncode == 1
    assert json.loads(nothing.stdout)["passed"] == 0
    malformed = subprocess.run(
        [*CLI, "conformance", f"sqlite:///{tmp_path / 'c.db'}", "-k", "(unclosed"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=tmp_path,
    )
    assert malformed.returncode == 2, malformed.stdout  # pytest's usage error
    assert "no conformance test ran (pytest exit code 4)" in malformed.stderr
