"""Checking Jepsen histories (``consensus check PATH --format jepsen-log|jepsen-edn``) with either engine.

Each file is one history; its operations are split per key (P-compositionality:
a history is linearizable iff each key's is) and each key is searched on its
own with the WGL search and the file's model. ``check_objects`` is the
per-bucket function: the local engine calls it in this process, the Spark job
once per bucket of keys (``pmod(xxhash64(file, key), buckets)``); a key is
never split, so both reach the same verdicts. With Spark the executors read
and parse the files too (``binaryFiles`` of the URL, ``checker.spark_io``). A file's verdict: ``invalid``
if it cannot be parsed, else ``violation`` if a key is not linearizable, else
``unknown`` if a key's search ran out of budget, else ``ok``.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

import pyarrow as pa

from consensus_api.errors import ConfigurationError
from consensus_chaos.check import jepsen, models, wgl
from consensus_chaos.check.ops import COLUMNS, INVALID, OP_ID, PASS, UNKNOWN, VIOLATION, Operation, bar
from consensus_chaos.check.shrink import Item, search_items, shrink
from consensus_chaos.check.spark import spark_session
from consensus_chaos.check.spark_io import history_url, local_path, readable, ship_code

INPUT_COLUMNS: Final = {
    "file": "string",
    "key": "string",
    "process": "bigint",
    "call": "bigint",
    "ret": "bigint",
    "op": "string",
}
OUTPUT_COLUMNS: Final = {
    "file": "string",
    "key": "string",
    "verdict": "string",
    "ops": "bigint",
    "steps": "bigint",
    "ms": "double",
    "detail": "string",
}
_VERDICTS: Final = {wgl.OK: PASS, wgl.ILLEGAL: VIOLATION, wgl.UNKNOWN: UNKNOWN}


def _arrow_schema(columns: dict[str, str]) -> Any:
    types = {"string": pa.string(), "bigint": pa.int64(), "double": pa.float64()}
    return pa.schema([(name, types[kind]) for name, kind in columns.items()])


def spark_ddl() -> str:
    """The output schema as a Spark DDL string."""
    return ", ".join(f"`{name}` {kind}" for name, kind in OUTPUT_COLUMNS.items())


def _encode(op: models.Op) -> str:
    return json.dumps(op)


def _decode(text: str) -> models.Op:
    f, a, b = json.loads(text)
    return (f, models.NIL if a == [] else a, models.NIL if b == [] else b)


def to_table(rows: list[tuple[Any, ...]]) -> Any:
    """Operations as input rows (``parse_file``) in one Arrow table (``INPUT_COLUMNS``)."""
    return pa.Table.from_pylist([dict(zip(INPUT_COLUMNS, row, strict=True)) for row in rows],
                                schema=_arrow_schema(INPUT_COLUMNS))  # fmt: skip


def input_ddl() -> str:
    """The input schema as a Spark DDL string."""
    return ", ".join(f"`{name}` {kind}" for name, kind in INPUT_COLUMNS.items())


def _operation(process: int, call: int, ret: int | None) -> Operation:
    """An ``Operation`` for the shrinker and the timeline (times are line numbers; op id = invoke line)."""
    row: list[int | None] = [None] * len(COLUMNS)
    row[OP_ID] = call
    return Operation(tuple(row), "", process, call, ret=ret, outcome="ok" if ret is not None else "info")


def check_objects(table: Any, model_name: str, budget: wgl.Budget, explain: bool) -> Any:
    """The per-bucket function: one output row per (file, key) of ``table``; with ``explain`` a violation's
    row carries its failing window, its key's timeline and the longest linearizable prefix."""
    kind = models.MODELS[model_name]
    columns = [table.column(name).to_pylist() for name in INPUT_COLUMNS]
    objects: dict[tuple[str, str], list[Item]] = defaultdict(list)
    for file, key, process, call, ret, op in zip(*columns, strict=True):
        objects[(file, key)].append((_operation(process, call, ret), _decode(op), call, ret))
    out = []
    for (file, key), items in objects.items():
        items.sort(key=lambda i: i[2])
        began = time.perf_counter()
        result = search_items(items, kind.initial, budget, kind.step, deepest=explain)
        detail: dict[str, Any] = {"message": result.reason}
        if result.verdict == wgl.ILLEGAL and explain:
            detail = _explain(items, result, budget, kind)
        ms = (time.perf_counter() - began) * 1000
        verdict = _VERDICTS[result.verdict]
        out.append(
            {"file": file, "key": key, "verdict": verdict, "ops": len(items), "steps": result.steps, "ms": ms,
             "detail": json.dumps(detail) if verdict != PASS else None}
        )  # fmt: skip
    return pa.Table.from_pylist(out, schema=_arrow_schema(OUTPUT_COLUMNS))


def _explain(
    items: list[Item], result: wgl.Result[Any], budget: wgl.Budget, kind: models.Model[Any]
) -> dict[str, Any]:
    message, window = shrink(items, result, budget, kind)
    position = {op: index for index, op in enumerate(result.order)}
    timeline = []
    for index, (op, m, _, _) in enumerate(items):
        item = bar(op, kind.describe(m), index == result.failed_op)
        item["prefix"] = position.get(index)
        timeline.append(item)
    return {"message": message, "window": window, "timeline": timeline, "prefix": len(result.order)}


def run_files(
    url: str,
    show: Callable[[str], str],
    *,
    fmt: str,
    model_name: str,
    budget: wgl.Budget,
    explain: bool,
    session: Any,
) -> tuple[dict[str, FileVerdict], pa.Table]:
    """``check_files`` on Spark: the executors read and parse the files at ``url`` (``binaryFiles``;
    ``show`` gives a file's name from Spark's), then check the keys hashed into buckets, one call of
    ``check_objects`` per bucket. Returns the verdicts by file so far and the output rows."""
    from pyspark.sql import functions as F  # noqa: N812, PLC0415 - pyspark, the optional spark extra

    ship_code(session.sparkContext)
    files = session.sparkContext.binaryFiles(url)
    parsed = files.map(lambda item: parse_file(show(item[0]), item[1], fmt, model_name)).cache()
    try:
        verdicts = {v.path: v for v in sorted(parsed.keys().collect(), key=lambda v: v.path)}
        if not verdicts:
            raise ConfigurationError(f"no history file in {url}")
        objects = sum(v.keys for v in verdicts.values())
        if not objects:
            return verdicts, check_objects(to_table([]), model_name, budget, explain)
        buckets = max(1, min(objects, 4 * session.sparkContext.defaultParallelism))
        session.conf.set("spark.sql.shuffle.partitions", str(buckets))
        frame = session.createDataFrame(parsed.flatMap(lambda each: each[1]), schema=input_ddl())
        keyed = frame.withColumn("bucket", F.expr(f"pmod(xxhash64(file, key), {buckets})"))

        def check_bucket(bucket: pa.Table) -> pa.Table:  # the hints tell Spark this takes a whole group
            return check_objects(bucket.drop_columns(["bucket"]), model_name, budget, explain)

        return verdicts, keyed.groupBy("bucket").applyInArrow(check_bucket, schema=spark_ddl()).toArrow()
    finally:
        parsed.unpersist()


def parse_file(
    name: str, data: bytes, fmt: str, model_name: str
) -> tuple[FileVerdict, list[tuple[Any, ...]]]:
    """The history file ``name`` with contents ``data``: its verdict so far (ok with its operations and
    keys, or invalid with the reason) and its operations as input rows (``INPUT_COLUMNS``)."""
    began = time.perf_counter()
    try:
        ops = jepsen.parse_data(Path(name), data, fmt, model_name)
    except jepsen.HistoryParseError as exc:
        return FileVerdict(name, INVALID, error=str(exc)), []
    keys = len({o.key for o in ops})
    rows = [(name, o.key, o.process, o.call, o.ret, _encode(o.op)) for o in ops]
    return FileVerdict(name, PASS, len(ops), keys, time.perf_counter() - began), rows


@dataclass(slots=True)
class FileVerdict:
    """The verdict of one history file."""

    path: str
    verdict: str
    operations: int = 0
    keys: int = 0
    seconds: float = 0.0
    error: str = ""
    violation: dict[str, Any] = field(default_factory=dict)
    findings: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """Verdict, operations, keys, seconds; for a violation its key, message and minimal failing window."""
        data: dict[str, Any] = {
            "file": self.path,
            "verdict": self.verdict,
            "operations": self.operations,
            "keys": self.keys,
            "seconds": round(self.seconds, 4),
        }
        if self.error:
            data["error"] = self.error
        if self.violation:
            data["violation"] = {
                k: self.violation[k] for k in ("key", "message", "window") if k in self.violation
            }
        return data


def history_paths(path: Path) -> list[Path]:
    """``path`` itself, or the files of the directory ``path`` (sorted; hidden files skipped)."""
    if path.is_file():
        return [path]
    paths = sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith("."))
    if not paths:
        raise ConfigurationError(f"no history file in {path}")
    return paths


def check_files(
    path: Path | str,
    fmt: str,
    model_name: str,
    *,
    engine: str = "local",
    budget: wgl.Budget | None = None,
    explain: bool = False,
    master: str = "local[*]",
    session: Any = None,
) -> list[FileVerdict]:
    """Check every history file at ``path`` (a file or a directory; with Spark also a URL its executors
    read); one verdict per file, in path order."""
    if fmt not in jepsen.FORMATS:
        raise ConfigurationError(f"unknown format {fmt!r}; expected one of {', '.join(jepsen.FORMATS)}")
    if model_name not in models.MODELS:
        raise ConfigurationError(f"unknown model {model_name!r}; expected one of {', '.join(models.MODELS)}")
    if engine not in ("local", "spark"):
        raise ConfigurationError(f"unknown engine {engine!r}; expected spark or local")
    budget = budget or wgl.Budget()
    local = local_path(path)
    files = history_paths(local) if local is not None and local.exists() else []
    if engine == "local":
        if local is None or not local.exists():
            raise ConfigurationError(f"the local engine reads local files; no such file: {path}")
        parsed = [parse_file(str(file), file.read_bytes(), fmt, model_name) for file in files]
        verdicts = {verdict.path: verdict for verdict, _ in parsed}
        output = check_objects(
            to_table([row for _, rows in parsed for row in rows]), model_name, budget, explain
        )
    else:
        url = history_url(path)
        with readable(url):
            session = session or spark_session(master)
            verdicts, output = run_files(
                url,
                _shown(path),
                fmt=fmt,
                model_name=model_name,
                budget=budget,
                explain=explain,
                session=session,
            )
    for row in output.to_pylist():
        _merge(verdicts[row["file"]], row)
    return list(verdicts.values())


def _shown(path: Path | str) -> Callable[[str], str]:
    """How a file Spark names (``file:/abs/dir/x.log``) is shown: under ``path`` as given when that is
    local (as the local engine shows it), else as Spark names it."""
    local = local_path(path)
    if local is None:
        return lambda name: name
    given, root = local, local.resolve()

    def show(name: str) -> str:
        found = Path(urlsplit(name).path)
        return str(given) if found == root else str(given / found.relative_to(root))

    return show


def _merge(verdict: FileVerdict, row: dict[str, Any]) -> None:
    verdict.seconds += row["ms"] / 1000
    if row["verdict"] == PASS:
        return
    detail = json.loads(row["detail"] or "{}")
    finding = {"key": row["key"], "verdict": row["verdict"], "ops": row["ops"], **detail}
    verdict.findings.append(finding)
    verdict.findings.sort(key=lambda f: (f["verdict"] != VIOLATION, f["key"]))
    if row["verdict"] == VIOLATION:
        verdict.verdict = VIOLATION
        verdict.violation = verdict.findings[0]
    elif verdict.verdict == PASS:
        verdict.verdict = UNKNOWN


def exit_code(verdicts: list[FileVerdict]) -> int:
    """2 if a file is invalid, else 1 if a history is not linearizable, else 3 if a search ran out of
    budget, else 0."""
    found = {v.verdict for v in verdicts}
    for verdict, code in ((INVALID, 2), (VIOLATION, 1), (UNKNOWN, 3)):
        if verdict in found:
            return code
    return 0
