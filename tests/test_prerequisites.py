"""What a test server needs on the machine: `consensus servers install`, and the one line a missing
prerequisite is (consensus_testkit.prerequisites)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from cli_support import assert_clean_error, run

from consensus_backends.kafka.testkit.launcher import KAFKA_JARS
from consensus_testkit.prerequisites import DebianPackage, NotInstalledError, check, install

MISSING = DebianPackage(
    what="a package nobody has",
    packages=("consensus-no-such-package-17", "consensus-no-such-package"),
    present=lambda: False,
)
PRESENT = DebianPackage(what="a package everybody has", packages=("coreutils",), present=lambda: True)


def test_a_missing_debian_package_is_the_apt_get_line_to_run_as_root() -> None:
    said: list[str] = []
    left = install([PRESENT, MISSING], run_apt=False, say=said.append)
    # no candidate is known to apt: the last one, the generic name, is named
    line = "apt-get install -y --no-install-recommends consensus-no-such-package"
    assert left == [f"as root: apt-get update && {line} (or this command with --yes, as root)"]
    assert said == ["a package everybody has: ok"]


def test_a_missing_prerequisite_names_the_install_command() -> None:
    check("demo", [PRESENT])
    with pytest.raises(NotInstalledError, match=r"^demo needs a package nobody has \(Debian package "):
        check("demo", [PRESENT, MISSING])
    with pytest.raises(NotInstalledError, match=r": run `consensus servers install demo`$"):
        check("demo", [MISSING])


def test_a_server_without_its_jars_is_one_line_and_exit_2(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("CONSENSUS_CACHE", str(tmp_path))
    result = run("servers", "run", "kafka", "--", "true")
    assert_clean_error(result, 2, "run `consensus servers install kafka`")
    assert len(result.stderr.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == []  # nothing started, nothing fetched


def test_servers_install_fetches_the_kafka_jars_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CONSENSUS_CACHE", str(tmp_path))
    assert not KAFKA_JARS.installed()
    first = run("servers", "install", "kafka")
    assert first.exit_code == 0, first.output
    assert KAFKA_JARS.installed()
    jars = sorted(path.name for path in KAFKA_JARS.directory.glob("*.jar"))
    assert any(name.startswith("kafka_2.13-") for name in jars)
    began = time.monotonic()
    again = run("servers", "install", "kafka")  # a second run only checks
    assert again.exit_code == 0, again.output
    assert time.monotonic() - began < 10
    assert "the Kafka" in again.stdout and "jars: ok" in again.stdout
    assert sorted(path.name for path in KAFKA_JARS.directory.glob("*.jar")) == jars


def test_servers_install_of_sqlite_needs_nothing() -> None:
    result = run("servers", "install", "sqlite")
    assert result.exit_code == 0, result.output
    assert result.stdout == ""
