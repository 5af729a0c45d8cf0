"""The test kit's Spark standalone cluster (``consensus servers run spark``): a master and two workers of
one core each, started with pyspark's own ``bin/spark-class`` on free loopback ports, in their own temp
dir, and controlled by PID like every test server (``consensus_testkit.process``).

The executors run another Python than the driver: ``SPARK_PYTHON``, a virtual
environment in the cache dir with pyspark, pandas and pyarrow (the driver's
versions) and nothing of consensus-api, made by ``consensus servers install
spark``. A check on this cluster thus shows that the job ships its own code.
``consensus servers run spark`` exports what a driver needs to use the cluster
as it runs: ``CONSENSUS_SPARK_MASTER`` (``spark://127.0.0.1:PORT``),
``PYSPARK_PYTHON`` (that environment's interpreter) and ``SPARK_EXECUTOR_MEMORY``
(what a worker offers). Heaps are small: 512 MB for the master, each worker and
each executor.
"""

from __future__ import annotations

import json
import os
import tempfile
import urllib.error
import urllib.request
from collections.abc import Mapping
from importlib.metadata import version
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from consensus_testkit.host import HOST, free_port
from consensus_testkit.launchers import PROBE_PORT_FILE, Launcher
from consensus_testkit.prerequisites import JAVA, PythonEnvironment
from consensus_testkit.process import ServerHandle, launch

START_TIMEOUT = 90.0
WORKERS = 2
DAEMON_MEMORY = "512m"
#: What each worker offers, and so what each executor gets.
EXECUTOR_MEMORY = "512m"
#: The variable holding the master URL for COMMAND (``consensus servers run spark -- COMMAND``).
MASTER_VARIABLE = "CONSENSUS_SPARK_MASTER"

SPARK_PYTHON = PythonEnvironment(
    what="the Spark executors' Python (pyspark, pandas, pyarrow; no consensus-api)",
    into="spark-python",
    packages=tuple(f"{name}=={version(name)}" for name in ("pyspark", "pandas", "pyarrow")),
)


def spark_home() -> Path:
    """The pyspark package's directory: its ``bin/spark-class`` and ``jars``."""
    spec = find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise RuntimeError("pyspark is not installed: pip install 'consensus-api[spark]'")
    return Path(spec.origin).parent


class SparkCluster(ServerHandle):
    """A running Spark standalone cluster: this handle is the master (its ``url`` the master URL), each
    of ``workers`` a worker's own handle. ``stop`` stops the workers, then the master; ``kill``,
    ``pause`` and ``restart`` act on the master only, a worker's on ``workers[i]``."""

    def __init__(self, url: str, port: int, directory: Path, *, command: list[str], web_port: int) -> None:
        super().__init__(
            "spark",
            url,
            port,
            directory,
            command=command,
            probe=lambda: probe(web_port),
        )
        self.web_port = web_port
        self.workers: list[ServerHandle] = []

    def status(self) -> dict[str, Any]:
        """What the master says of itself (its web UI's ``/json``): workers, cores, applications."""
        return _master_json(self.web_port) or {}

    def alive_workers(self) -> list[int]:
        """The ports of the workers the master counts alive."""
        return [int(w["port"]) for w in self.status().get("workers", []) if w.get("state") == "ALIVE"]

    def stop(self) -> None:
        for worker in self.workers:
            worker.stop()
        super().stop()


def start(workdir: Path | None = None, *, secure: bool = False) -> SparkCluster:
    """Start a master and ``WORKERS`` workers; return once every worker has registered. ``secure`` is
    refused (no such variant): the launcher declares none."""
    if secure:
        raise ValueError("the Spark test cluster has no secure variant")
    directory = Path(tempfile.mkdtemp(prefix="spark-", dir=workdir))
    (directory / "conf").mkdir()  # SPARK_CONF_DIR: empty, so no spark-env.sh of the machine applies
    port, web_port = free_port(), free_port()
    (directory / PROBE_PORT_FILE).write_text(str(web_port))
    master = ("org.apache.spark.deploy.master.Master", "--port", str(port), "--webui-port", str(web_port))
    command = _daemon(directory, *master)
    cluster = SparkCluster(f"spark://{HOST}:{port}", port, directory, command=command, web_port=web_port)
    launch(cluster, START_TIMEOUT)
    try:
        for number in range(1, WORKERS + 1):
            cluster.workers.append(_worker(cluster, number))
            cluster.workers[-1].spawn()
        for worker in cluster.workers:
            worker.wait_ready(START_TIMEOUT)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _worker(cluster: SparkCluster, number: int) -> ServerHandle:
    directory = cluster.directory / f"worker-{number}"
    directory.mkdir()
    port = free_port()
    options = ["--port", str(port), "--webui-port", str(free_port()), "--cores", "1"]
    options += ["--memory", EXECUTOR_MEMORY, "--work-dir", str(directory / "work"), cluster.url]
    return ServerHandle(
        f"spark-worker-{number}",
        cluster.url,
        port,
        directory,
        command=_daemon(cluster.directory, "org.apache.spark.deploy.worker.Worker", *options),
        probe=lambda: port in cluster.alive_workers(),
    )


def _daemon(directory: Path, main_class: str, *options: str) -> list[str]:
    """``spark-class main_class`` in an environment of its own (``env -i``): only what the script and
    the JVMs need, the cluster's empty conf dir and its scratch dir (what executors write stays in the
    cluster's dir, also after a SIGKILL), loopback addresses and small heaps. Nothing else of the
    starting process's environment (a PYTHONPATH naming our sources) reaches the executors."""
    kept = [
        f"{name}={os.environ[name]}"
        for name in ("PATH", "HOME", "JAVA_HOME", "LANG", "TMPDIR")
        if name in os.environ
    ]
    settings = {
        "SPARK_HOME": str(spark_home()),
        "SPARK_CONF_DIR": str(directory / "conf"),
        "SPARK_LOCAL_DIRS": str(directory / "local"),  # the executors' scratch space: gone with the cluster
        "SPARK_LOCAL_IP": HOST,
        "SPARK_DAEMON_MEMORY": DAEMON_MEMORY,
        "SPARK_DAEMON_JAVA_OPTS": "-XX:+UseSerialGC -XX:TieredStopAtLevel=1",
    }
    spark_class = str(spark_home() / "bin" / "spark-class")
    return [
        "env",
        "-i",
        *kept,
        *(f"{k}={v}" for k, v in settings.items()),
        spark_class,
        main_class,
        "--host",
        HOST,
        *options,
    ]


def _master_json(web_port: int) -> dict[str, Any] | None:
    try:
        with urllib.request.urlopen(f"http://{HOST}:{web_port}/json/", timeout=1) as response:
            answer = json.loads(response.read())
    except (urllib.error.URLError, OSError, ValueError):
        return None
    return answer if isinstance(answer, dict) else None


def probe(web_port: int) -> bool:
    """Whether the master whose web UI listens on ``web_port`` is up and in charge (status ALIVE)."""
    answer = _master_json(web_port)
    return answer is not None and answer.get("status") == "ALIVE"


def environment(cluster: ServerHandle) -> Mapping[str, str]:
    """What ``consensus servers run spark`` exports to COMMAND (see the module docstring)."""
    return {
        MASTER_VARIABLE: cluster.url,
        "PYSPARK_PYTHON": str(SPARK_PYTHON.python),
        "SPARK_EXECUTOR_MEMORY": EXECUTOR_MEMORY,
    }


SPARK = Launcher(name="spark", start=start, probe=probe, needs=(JAVA, SPARK_PYTHON), environment=environment)
