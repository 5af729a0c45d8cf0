"""The history check on a Spark standalone cluster (``consensus servers run spark``: a master and two
workers) whose executors run a Python without consensus-api: the verdicts of local[2], also when a
worker is SIGKILLed mid-check, and a clear error for a history the executors cannot read."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from click.testing import CliRunner
from pyspark.sql import SparkSession
from test_checker import VIOLATIONS, linearizable, verdicts
from test_external_histories import DATA, EXPECTED, SUBSETS

from consensus_api.cli import cli
from consensus_api.errors import ConfigurationError
from consensus_chaos.check import check_history
from consensus_chaos.check.external import check_files
from consensus_chaos.check.spark import spark_session
from consensus_chaos.check.spark_io import code_zip
from consensus_chaos.spark_server import SPARK, SPARK_PYTHON, SparkCluster
from consensus_testkit import prerequisites, start_server

DRIVER_MEMORY = "512m"


@pytest.fixture(scope="module")
def cluster() -> Iterator[SparkCluster]:
    """The cluster, its executors' Python made first if missing (as ``consensus servers install spark``
    does); this process is set up as ``consensus servers run spark`` sets up COMMAND."""
    assert prerequisites.install(SPARK.needs, run_apt=False, say=lambda line: None) == []
    with pytest.MonkeyPatch.context() as patch:
        started = start_server("spark")
        try:
            assert isinstance(started, SparkCluster)
            assert SPARK.environment is not None
            for name, value in SPARK.environment(started).items():
                patch.setenv(name, value)
            yield started
        finally:
            if (active := SparkSession.getActiveSession()) is not None:
                active.stop()
            started.stop()


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Histories with every planted violation of tests/test_checker.py and a linearizable one."""
    directory = tmp_path_factory.mktemp("planted")
    for build, _ in VIOLATIONS.values():
        build().save(directory)
    return linearizable().save(directory)


def run_cli(*args: str) -> Any:
    return CliRunner().invoke(cli, ["check", *args, "--driver-memory", DRIVER_MEMORY], catch_exceptions=False)


def comparable(outcome: dict[str, Any]) -> dict[str, Any]:
    """What two runs of ``consensus check --json`` must agree on (not timings or search steps)."""
    checks = {name: {k: v for k, v in c.items() if k != "steps"} for name, c in outcome["checks"].items()}
    findings = [{k: f[k] for k in ("check", "run", "key", "verdict", "message")} for f in outcome["findings"]]
    kept = ("exit_code", "runs", "faults", "fenced_overlaps", "latency_ms")
    return {"checks": checks, "findings": findings, **{k: outcome[k] for k in kept}}


def _command(process: psutil.Process) -> list[str]:
    """The command line of ``process``; empty once it has ended."""
    try:
        return process.cmdline()
    except psutil.Error:
        return []


def external_verdicts(session: Any) -> dict[str, list[tuple[Any, ...]]]:
    """Per subset of the Jepsen/porcupine histories: each file's name, verdict, operations, keys."""
    found = {}
    for subset, (fmt, model) in SUBSETS.items():
        checked = check_files(DATA / subset, fmt, model, engine="spark", session=session)
        found[subset] = [(Path(v.path).name, v.verdict, v.operations, v.keys) for v in checked]
    return found


def test_the_executors_python_has_no_consensus_api(cluster: SparkCluster, tmp_path: Path) -> None:
    python = os.environ["PYSPARK_PYTHON"]
    assert python == str(SPARK_PYTHON.python)
    assert python != sys.executable
    imported = subprocess.run(
        [python, "-c", "import consensus_api"], check=False, cwd=tmp_path, capture_output=True, text=True
    )
    assert imported.returncode == 1
    assert "No module named 'consensus_api'" in imported.stderr
    subprocess.run([python, "-c", "import pyspark, pandas, pyarrow"], cwd=tmp_path, check=True)
    assert sorted(cluster.alive_workers()) == sorted(worker.port for worker in cluster.workers)


def test_the_cluster_reaches_the_verdicts_of_local2(cluster: SparkCluster, planted: Path) -> None:
    url = f"file://{planted}"
    in_local = run_cli(url, "--master", "local[2]", "--json")
    external_in_local = external_verdicts(spark_session("local[2]", DRIVER_MEMORY))
    on_cluster = run_cli(url, "--master", cluster.url, "--json")
    session = spark_session(cluster.url, DRIVER_MEMORY)
    assert session.sparkContext.master == cluster.url
    external_on_cluster = external_verdicts(session)

    assert in_local.exit_code == on_cluster.exit_code == 1  # the planted violations
    assert comparable(json.loads(on_cluster.output)) == comparable(json.loads(in_local.output))
    found = {(f["run"], f["check"], f["verdict"]) for f in json.loads(on_cluster.output)["findings"]}
    assert found == {(name, check, "violation") for name, (_, check) in VIOLATIONS.items()}
    assert external_on_cluster == external_in_local
    for subset, files in external_on_cluster.items():
        assert {name: verdict == "ok" for name, verdict, *_ in files} == EXPECTED[subset]

    # The executors ran the other Python, with the code the job shipped them.
    for worker in cluster.workers:
        commands = map(_command, psutil.Process(worker.pid).children(recursive=True))
        pythons = {command[0] for command in commands if "pyspark.daemon" in command}
        assert pythons == {str(SPARK_PYTHON.python)}
        assert list((worker.directory / "work").glob(f"app-*/*/{code_zip().name}"))


def test_a_worker_killed_mid_check_changes_no_verdict(cluster: SparkCluster, planted: Path) -> None:
    expected = check_history(planted, "local")
    session = spark_session(cluster.url, DRIVER_MEMORY)
    tracker = session.sparkContext.statusTracker()
    results: dict[str, Any] = {}

    def check() -> None:
        try:
            results["outcome"] = check_history(planted, "spark", session=session)
        except Exception as error:  # reported by the assertion below
            results["error"] = error

    running = threading.Thread(target=check)
    running.start()
    deadline = time.monotonic() + 120
    while not any(
        (stage := tracker.getStageInfo(i)) and stage.numActiveTasks for i in tracker.getActiveStageIds()
    ):
        assert running.is_alive() and time.monotonic() < deadline, "no task ran"
        time.sleep(0.01)
    victim = cluster.workers[0]
    victim.kill()  # SIGKILL: the worker, its executor and the executor's Python workers
    killed_mid_check = running.is_alive()
    running.join(240)
    assert killed_mid_check
    assert "error" not in results, results.get("error")
    outcome = results["outcome"]
    assert verdicts(outcome) == verdicts(expected)
    assert {n: (c.verdict, c.objects, c.ops) for n, c in outcome.checks.items()} == {
        n: (c.verdict, c.objects, c.ops) for n, c in expected.checks.items()
    }
    deadline = time.monotonic() + 30
    while victim.port in cluster.alive_workers():  # the master saw the connection drop, or a heartbeat fail
        assert time.monotonic() < deadline, "the master still counts the killed worker alive"
        time.sleep(0.1)


def test_a_scheme_spark_has_no_file_system_for_is_a_clear_error(cluster: SparkCluster) -> None:
    session = spark_session(cluster.url, DRIVER_MEMORY)
    with pytest.raises(ConfigurationError, match=r"Spark cannot read s3a://histories/run-1: .*S3AFileSystem"):
        check_history("s3a://histories/run-1", "spark", session=session)


def test_files_only_the_driver_sees_are_a_clear_error(planted: Path, tmp_path: Path) -> None:
    """``consensus servers run spark`` runs a driver in a mount namespace of its own (``unshare``), where a
    tmpfs holds the files: the driver lists them, the executors find the directory empty."""
    if (active := SparkSession.getActiveSession()) is not None:
        active.stop()  # its executors are not needed any more
    hidden = tmp_path / "driver-only"
    hidden.mkdir()
    consensus = Path(sys.executable).with_name("consensus")
    script = (
        'echo "master=$CONSENSUS_SPARK_MASTER python=$PYSPARK_PYTHON memory=$SPARK_EXECUTOR_MEMORY" >&2'
        ' && mount -t tmpfs tmpfs "$1" && cp "$2"/*.parquet "$1"'
        f' && exec "$3" check "$1" --master "$CONSENSUS_SPARK_MASTER" --driver-memory {DRIVER_MEMORY}'
    )
    command = [consensus, "servers", "run", "spark", "--", "unshare", "--mount", "--propagation", "private"]
    command += ["sh", "-c", script, "-", hidden, planted, consensus]
    environment = {
        k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "SPARK_EXECUTOR_MEMORY")
    }
    checked = subprocess.run(
        list(map(str, command)), env=environment, check=False, capture_output=True, text=True, timeout=300
    )
    assert checked.returncode == 2, checked.stderr
    message = " ".join(checked.stderr.split())
    assert "master=spark://127.0.0.1:" in message
    assert f"python={SPARK_PYTHON.python} memory=512m" in message
    assert f"Spark cannot read file://{hidden}:" in message
    assert "File does not exist" in message
    assert "every executor must read it at that URL" in message


def test_a_cluster_with_no_room_for_an_executor_fails_in_time(
    cluster: SparkCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the job asks more memory than any worker has: the master never gives it an executor, and the
    # check says so within its bound instead of waiting for resources forever
    if (active := SparkSession.getActiveSession()) is not None:
        active.stop()
    monkeypatch.setenv("SPARK_EXECUTOR_MEMORY", "64g")
    started = time.monotonic()
    with pytest.raises(ConfigurationError, match="gave this check no executor within 5 s"):
        spark_session(cluster.url, DRIVER_MEMORY, executor_wait=5)
    assert time.monotonic() - started < 60
    # positive control: with what the workers have, the same master gives one at once
    monkeypatch.undo()
    session = spark_session(cluster.url, DRIVER_MEMORY, executor_wait=60)
    assert session.sparkContext._jsc.sc().getExecutorMemoryStatus().size() >= 2
