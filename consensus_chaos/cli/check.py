"""``consensus check``: check recorded histories (linearizability, elections, membership, listeners, locks),
ours (Parquet) or Jepsen's (``--format jepsen-log|jepsen-edn``)."""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.table import Table
from rich.text import Text

from consensus_api.cli._common import out_console, require_extra
from consensus_api.errors import ConfigurationError
from consensus_chaos.check import Budget, check_history
from consensus_chaos.check.external import check_files, exit_code
from consensus_chaos.check.external_report import write_report as write_html
from consensus_chaos.check.report import write_report
from consensus_chaos.check.spark_io import is_url, local_path

FORMATS = ("parquet", "jepsen-log", "jepsen-edn")
DEFAULT_MODELS = {"jepsen-log": "register", "jepsen-edn": "kv"}


def _location(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """PATH: a URL, or a local path that exists."""
    if is_url(value) or Path(value).exists():
        return value
    raise click.BadParameter(f"{value!r} does not exist (a local path, or a URL: file://, s3a://, hdfs://)")


@click.command("check")
@click.argument("path", callback=_location)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(FORMATS),
    default="parquet",
    show_default=True,
    help="parquet: a directory written by consensus chaos; jepsen-log / jepsen-edn: Jepsen histories, "
    "one per file (PATH a file or a directory of them).",
)
@click.option(
    "--model",
    type=click.Choice(["register", "kv"]),
    default=None,
    help="The model of Jepsen histories: register (read, write, cas) or kv (get, put, append per key); "
    "default register for jepsen-log, kv for jepsen-edn.",
)
@click.option(
    "--engine",
    type=click.Choice(["spark", "local"]),
    default="spark",
    show_default=True,
    help="spark: the PySpark job; local: the same checks in this process.",
)
@click.option("--master", default="local[*]", show_default=True, help="Spark master URL.")
@click.option(
    "--driver-memory",
    default="2g",
    show_default=True,
    help="The Spark driver's heap (with local[N] also the executors'): only the checks' output is "
    "collected to it, never the history.",
)
@click.option(
    "--report",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write an HTML report here.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
@click.option(
    "--time-budget",
    type=click.FloatRange(min=0.01),
    default=10.0,
    show_default=True,
    help="Seconds of search per key before its verdict is unknown.",
)
@click.option(
    "--state-budget",
    type=click.IntRange(min=1000),
    default=2_000_000,
    show_default=True,
    help="Search states cached per key before its verdict is unknown.",
)
@click.pass_context
def check(  # noqa: PLR0917 - click passes every option as a parameter
    ctx: click.Context,
    path: str,
    fmt: str,
    model: str | None,
    engine: str,
    master: str,
    driver_memory: str,
    report: Path | None,
    as_json: bool,
    time_budget: float,
    state_budget: int,
) -> None:
    """Check every history (*.parquet) in the directory PATH, as written by ``consensus chaos``, or with
    --format jepsen-log / jepsen-edn every Jepsen history at PATH (a file, or a directory: each file one
    history). With Spark, PATH may be a URL the executors read (file:// on storage every machine
    mounts, s3a://, hdfs://); a local PATH is read as its file:// URL.

    Per key: linearizability against a versioned register (WGL search) and the
    listeners' events; per service: at most one leader per term, terms never
    going back, leadership reads in real-time order, no stale fenced write; per
    group: views only move forward and converge; per lock (--workload locks): no second holder of an
    exclusive lease unless the earlier one was fenced, tokens rising in grant order. Jepsen histories: per key
    linearizability against --model. Exit status: 0 all checks pass, 1 a
    violation, 3 only unknown verdicts (a budget ran out), 2 a usage error, an
    invalid history or a file that cannot be parsed (its line and why).
    """
    if engine == "spark":
        require_extra("spark", ["pyspark"], "--engine spark")
    budget = Budget(time_budget, state_budget)
    if fmt != "parquet":
        ctx.exit(
            check_jepsen(path, fmt, model or DEFAULT_MODELS[fmt], engine, master, budget, report, as_json)
        )
    if model is not None:
        raise ConfigurationError("--model applies to --format jepsen-log and jepsen-edn only")
    local = local_path(path)
    if local is not None and not local.is_dir():
        raise ConfigurationError(f"{path} is not a directory (a history written by consensus chaos)")
    outcome = check_history(path, engine, budget, master, driver_memory=driver_memory)
    if report is not None:  # the timelines where this process reads the history too: a local path
        write_report(outcome, report, local)
    if as_json:
        click.echo(json.dumps(outcome.to_json(), indent=2))
    else:
        console = out_console()
        table = Table(title=f"consensus check ({engine}, {outcome.seconds:.1f} s)")
        for column in ("check", "verdict", "objects", "ops", "violations", "unknown"):
            table.add_column(column, justify="left" if column in ("check", "verdict") else "right")
        for name, c in outcome.checks.items():
            style = {"ok": "green", "violation": "red", "invalid": "red", "unknown": "yellow"}.get(c.verdict)
            table.add_row(
                name,
                Text(c.verdict, style=style or ""),
                str(c.objects),
                str(c.ops),
                str(c.counts.get("violation", 0)),
                str(c.counts.get("unknown", 0)),
            )
        console.print(table)
        for finding in outcome.findings[:20]:
            message = finding["detail"].get("message", "")
            line = f"{finding['verdict']}: {finding['check']} of {finding['key']}: {message}"
            console.print(Text(line, style="red" if finding["verdict"] != "unknown" else "yellow"))
        if report is not None:
            console.print(Text(f"report: {report}"))
    ctx.exit(outcome.exit_code)


def check_jepsen(  # noqa: PLR0917 - the command's options
    path: str,
    fmt: str,
    model: str,
    engine: str,
    master: str,
    budget: Budget,
    report: Path | None,
    as_json: bool,
) -> int:
    """``consensus check --format jepsen-*``: one verdict per file; the exit code."""
    explain = as_json or report is not None
    verdicts = check_files(path, fmt, model, engine=engine, budget=budget, explain=explain, master=master)
    code = exit_code(verdicts)
    if report is not None:
        write_html(verdicts, engine, report)
    if as_json:
        summary = {"exit_code": code, "engine": engine, "format": fmt, "model": model}
        click.echo(json.dumps({**summary, "files": [v.to_json() for v in verdicts]}, indent=2))
        return code
    console = out_console()
    table = Table(title=f"consensus check ({fmt}, model {model}, {engine})")
    for column in ("file", "verdict", "operations", "keys", "seconds"):
        table.add_column(column, justify="left" if column in ("file", "verdict") else "right")
    style = {"ok": "green", "violation": "red", "invalid": "red", "unknown": "yellow"}
    for v in verdicts:
        cells = (str(v.operations), str(v.keys), f"{v.seconds:.3f}")
        table.add_row(Path(v.path).name, Text(v.verdict, style=style[v.verdict]), *cells)
    console.print(table)
    for v in verdicts:
        if v.error:
            console.print(Text(f"invalid: {v.error}", style="red"))
        elif v.violation:
            key = f" key {v.violation['key']!r}" if v.violation["key"] else ""
            message = v.violation.get("message") or "not linearizable (--json or --report for the window)"
            console.print(Text(f"violation: {Path(v.path).name}{key}: {message}", style="red"))
    if report is not None:
        console.print(Text(f"report: {report}"))
    return code
