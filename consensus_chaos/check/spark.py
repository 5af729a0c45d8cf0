"""The Spark job: bucket the history by object and run the per-bucket function with ``applyInArrow``.

``bucket = pmod(xxhash64(run, object), buckets)``, then
``groupBy(bucket).applyInArrow(check_table)``: one Python call per bucket of
many objects, never one per key. The executors read the history from its URL
(``spark_io.history_url``) and run the checker's code that the job ships them
(``spark_io.ship_code``): an executor needs pyspark, pandas and pyarrow only.
The UI and console progress are off. pyspark (the ``spark`` extra) is imported
only when a job runs: the module loads without it.
"""

from __future__ import annotations

import os
import re
import sys
import time
from typing import Any
from urllib.parse import urlsplit

import pyarrow as pa

from consensus_api.errors import ConfigurationError
from consensus_chaos.check import wgl
from consensus_chaos.check.bucket import INPUT_COLUMNS, MEMBERS_SEPARATOR, check_table, spark_ddl
from consensus_chaos.check.spark_io import ship_code
from consensus_chaos.record.schema import COLUMNS

ROWS_PER_BUCKET = 20_000
MAX_BUCKETS = 1024
#: Shuffle partitions hold about this many rows at most, so a task's sort buffers stay small.
ROWS_PER_PARTITION = 1_000_000
DRIVER_MEMORY = "2g"
#: How long a job on a cluster waits for its first executor before it gives up (seconds).
EXECUTOR_WAIT = 120.0
LOOPBACK = "127.0.0.1"
_MEMORY = re.compile(r"[1-9][0-9]*[kmgt]?", re.IGNORECASE)
_SPARK_TYPES = {"string": "string", "int64": "bigint", "list<string>": "array<string>"}
#: The history schema (docs/history-format.md) as Spark DDL: Spark reads no footer to infer it.
HISTORY_DDL = ", ".join(f"`{name}` {_SPARK_TYPES[kind]}" for name, kind in COLUMNS.items())


def check_memory(amount: str) -> str:
    """``amount`` if it is a JVM memory size (``512m``, ``2g``); ``ConfigurationError`` otherwise."""
    if not _MEMORY.fullmatch(amount):
        raise ConfigurationError(f"driver memory must look like 512m or 2g, got {amount!r}")
    return amount


def spark_session(
    master: str = "local[*]", driver_memory: str = DRIVER_MEMORY, *, executor_wait: float = EXECUTOR_WAIT
) -> Any:
    """A SparkSession configured for this job (see the module docstring), the checker's code shipped to
    it; one running with ``master`` is reused, one with another master stopped first (a process holds
    one SparkContext).

    ``driver_memory`` caps the driver JVM's heap (with ``local[N]``, the executors' too): nothing
    collects the history to the driver, only the checks' output (findings, summaries, histograms).
    Executors run ``$PYSPARK_PYTHON``, by default this interpreter, with ``$SPARK_EXECUTOR_MEMORY`` when
    set. With ``local[N]`` or a master at a
    loopback address the driver binds 127.0.0.1; with another master it binds where the environment
    says (``SPARK_LOCAL_IP``, ``spark.driver.host`` in ``spark-defaults.conf``), so that executors on
    other machines reach it. On a cluster, a master that gives the job no executor within
    ``executor_wait`` seconds (no live worker, or none with the memory and a core the job asks) is a
    ``ConfigurationError``: a check never waits for resources forever."""
    check_memory(driver_memory)
    try:
        from pyspark.sql import SparkSession  # noqa: PLC0415 - pyspark, the optional spark extra
    except ImportError:
        raise ConfigurationError(
            "the Spark engine needs pyspark: pip install 'consensus-api[spark]'"
        ) from None
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    builder = (
        SparkSession.builder.master(master)
        .appName("consensus-check")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", driver_memory)
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.python.worker.reuse", "true")
    )
    executor_memory = os.environ.get("SPARK_EXECUTOR_MEMORY")
    if executor_memory:  # as configuration: a JVM this process started earlier never saw the variable
        builder = builder.config("spark.executor.memory", executor_memory)
    if on_this_machine(master):
        os.environ["SPARK_LOCAL_IP"] = LOOPBACK
        builder = builder.config("spark.driver.bindAddress", LOOPBACK).config("spark.driver.host", LOOPBACK)
    try:
        session = builder.getOrCreate()
        if session.sparkContext.master != master:
            session.stop()
            session = builder.getOrCreate()
    except Exception as exc:  # Java missing or unusable, ports refused...: the environment, not the history
        raise ConfigurationError(f"could not start Spark with master {master!r}: {exc}") from exc
    session.sparkContext.setLogLevel("ERROR")
    if not master.startswith("local"):
        _await_executor(session, master, executor_wait)
    ship_code(session.sparkContext)
    return session


def _await_executor(session: Any, master: str, wait: float) -> None:
    """Return once the master gave the job an executor; stop the session and raise
    ``ConfigurationError`` if it did not within ``wait`` seconds."""
    deadline = time.monotonic() + wait
    context = session.sparkContext
    while context._jsc.sc().getExecutorMemoryStatus().size() < 2:  # the driver counts as one
        if time.monotonic() >= deadline:
            memory = context.getConf().get("spark.executor.memory", "1g")
            session.stop()
            raise ConfigurationError(
                f"the Spark master {master} gave this check no executor within {wait:g} s: start its "
                f"workers (consensus servers run spark), or give one {memory} of memory and a free core "
                "($SPARK_EXECUTOR_MEMORY sets what the check asks)"
            )
        time.sleep(0.2)


def on_this_machine(master: str) -> bool:
    """Whether the master URL ``master`` runs the executors on this machine: ``local[N]`` or a
    loopback address."""
    return master.startswith("local") or urlsplit(master).hostname in ("127.0.0.1", "localhost", "::1")


def history_frame(session: Any, url: str) -> Any:
    """The history at ``url`` (its ``*.parquet`` files) as a DataFrame in the history schema: the driver
    lists the files, the executors read them."""
    return session.read.schema(HISTORY_DDL).parquet(f"{url}/*.parquet")


def run_sizes(frame: Any) -> tuple[dict[str, str], int]:
    """The backend of each run of ``frame`` and its number of rows (one job)."""
    counts = frame.groupBy("run", "backend").count().collect()
    return {row["run"]: row["backend"] for row in counts}, sum(row["count"] for row in counts)


def project(frame: Any) -> Any:
    """Rows per checked object (one scan): ``okind`` and ``object`` added, fenced writes also under their
    service, ``members`` joined into one string (an array column makes Arrow batching quadratic)."""
    from pyspark.sql import functions as F  # noqa: N812, PLC0415 - pyspark, the optional spark extra

    kind, key, service = F.col("kind"), F.col("key"), F.col("service")

    def pick(condition: Any, okind: str, name: Any) -> Any:
        return F.when(condition, F.struct(F.lit(okind).alias("okind"), name.cast("string").alias("object")))

    objects = F.array(
        pick(kind == "kv", "kv", key),
        pick((kind == "election") | ((kind == "kv") & service.isNotNull()), "election", service),
        pick(kind == "group", "group", key),
        pick(kind == "nemesis", "nemesis", F.lit(None)),
    )
    rows = frame.withColumn("o", F.explode(objects)).filter(F.col("o").isNotNull())
    rows = rows.withColumn("okind", F.col("o.okind")).withColumn("object", F.col("o.object"))
    return rows.withColumn("members", F.array_join("members", MEMBERS_SEPARATOR)).select(*INPUT_COLUMNS)


def run_spark(frame: Any, rows: int, budget: wgl.Budget, session: Any) -> Any:
    """Check the history ``frame`` of ``rows`` rows with ``session``; returns the output as a
    ``pyarrow.Table``.

    About ``ROWS_PER_BUCKET`` rows go to a bucket; a few shuffle partitions per
    core keep every core busy, and more of them keep each under
    ``ROWS_PER_PARTITION`` rows. Adaptive query execution is off for this job:
    it would only re-plan what is sized here.
    """
    from pyspark.sql import functions as F  # noqa: N812, PLC0415 - pyspark, the optional spark extra

    ship_code(session.sparkContext)
    buckets = max(1, min(MAX_BUCKETS, rows // ROWS_PER_BUCKET))
    cores = session.sparkContext.defaultParallelism
    partitions = max(min(buckets, 4 * cores), -(-rows // ROWS_PER_PARTITION))
    session.conf.set("spark.sql.shuffle.partitions", str(max(1, min(buckets, partitions))))
    session.conf.set("spark.sql.adaptive.enabled", "false")  # sized above (see the docstring)
    keyed = project(frame).withColumn("bucket", F.expr(f"pmod(xxhash64(run, object), {buckets})"))

    def check_bucket(table: pa.Table) -> pa.Table:  # the hints tell Spark this takes a whole group
        return check_table(table, budget)

    result = keyed.groupBy("bucket").applyInArrow(check_bucket, schema=spark_ddl())
    return result.toArrow()
