"""``consensus check``: check recorded histories (linearizability, elections, membership, listeners)."""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.table import Table
from rich.text import Text

from consensus_api.checker import Budget, check_history
from consensus_api.checker.report import write_report
from consensus_api.cli._common import out_console, require_extra


@click.command("check")
@click.argument("directory", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option(
    "--engine",
    type=click.Choice(["spark", "local"]),
    default="spark",
    show_default=True,
    help="spark: the PySpark job; local: the same checks in this process.",
)
@click.option("--master", default="local[*]", show_default=True, help="Spark master URL.")
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
    directory: Path,
    engine: str,
    master: str,
    report: Path | None,
    as_json: bool,
    time_budget: float,
    state_budget: int,
) -> None:
    """Check every history (*.parquet) in DIRECTORY, as written by ``consensus chaos``.

    Per key: linearizability against a versioned register (WGL search) and the
    listeners' events; per service: at most one leader per term, terms never
    going back, no stale fenced write; per group: views only move forward and
    converge. Exit status: 0 all checks pass, 1 a violation, 3 only unknown
    verdicts (a budget ran out), 2 a usage error or an invalid history.
    """
    require_extra("spark", ["pyarrow", "pyspark"] if engine == "spark" else ["pyarrow"], f"--engine {engine}")
    if report is not None:
        require_extra("spark", ["matplotlib"], "--report")
    outcome = check_history(directory, engine, Budget(time_budget, state_budget), master)
    if report is not None:
        write_report(outcome, report)
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
