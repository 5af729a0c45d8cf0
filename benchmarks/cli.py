"""``consensus bench URL``: ours against raw clients and tooz on the same server.

Installed with this folder's own distribution (``pip install ./benchmarks``, which ``scripts/venv.sh``
does); it registers the command in the entry-point group ``consensus_api.commands``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
from rich.console import Console

from benchmarks import report, runner
from consensus_api.cli._common import EXIT_FAILURE, err_console, expand_url


@click.command("bench")
@click.argument("url")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON instead of tables.")
@click.option("--quick", is_flag=True, help="Fewer samples, smaller scale, failover at 2 s only.")
@click.option(
    "--only",
    metavar="LIST",
    default="idle,ops,aio,propagation,membership,failover,detection,scale",
    help="Comma-separated workloads: idle, ops, aio, propagation, membership, failover, detection, scale; "
    "and, only when named, cutover (the leadership gap at a migration's cut-over between two namespaces "
    "of the server).",
)
@click.option("--output", type=click.Path(dir_okay=False, path_type=Path), help="Also write the JSON here.")
def bench(url: str, as_json: bool, quick: bool, only: str, output: Path | None) -> None:
    """Benchmark the backend URL names against its raw client and tooz, interleaved in one run.

    Prints p50/p99 latencies, throughput, ratios and whether each target holds
    (see docs/performance.md). Exit status 1 if a workload produced no numbers;
    targets that do not hold are reported, not an error.
    """
    chosen = {name.strip() for name in only.split(",") if name.strip()}
    unknown = chosen - set(runner.WORKLOADS)
    if unknown:
        raise click.UsageError(f"unknown workloads: {', '.join(sorted(unknown))}")
    console = err_console()
    result = runner.run(
        expand_url(url) or url,
        quick=quick,
        only=chosen,
        progress=lambda line: console.print(line, highlight=False),
    )
    text = json.dumps(result, indent=2)
    if output is not None:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text + "\n")
    if as_json:
        click.echo(text)
    else:
        wide = Console(highlight=False)
        report.print_report(result, wide if wide.is_terminal else Console(highlight=False, width=200))
    if report.failed(result):
        sys.exit(EXIT_FAILURE)
