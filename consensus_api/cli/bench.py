"""``consensus bench URL``: ours against raw clients and tooz on the same server (``benchmarks/``)."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from types import ModuleType

import click
from rich.console import Console

from consensus_api.cli._common import EXIT_FAILURE, err_console, expand_url
from consensus_api.errors import ConfigurationError


def _load(name: str) -> ModuleType:
    """``benchmarks.<name>`` from the source checkout this package runs from."""
    try:
        return importlib.import_module(f"benchmarks.{name}")
    except ModuleNotFoundError as exc:
        if exc.name not in ("benchmarks", f"benchmarks.{name}"):
            raise ConfigurationError(f"consensus bench needs {exc.name} (see benchmarks/README.md)") from None
    root = Path(__file__).resolve().parents[2]
    if not (root / "benchmarks" / "runner.py").is_file():
        raise ConfigurationError(
            "consensus bench runs from a source checkout (benchmarks/ next to consensus_api/)"
        )
    sys.path.insert(0, str(root))
    return importlib.import_module(f"benchmarks.{name}")


@click.command("bench")
@click.argument("url")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON instead of tables.")
@click.option("--quick", is_flag=True, help="Fewer samples, smaller scale, failover at 2 s only.")
@click.option(
    "--only",
    metavar="LIST",
    default="ops,aio,propagation,membership,failover,detection,scale",
    help="Comma-separated workloads: ops, aio, propagation, membership, failover, detection, scale.",
)
@click.option("--output", type=click.Path(dir_okay=False, path_type=Path), help="Also write the JSON here.")
def bench(url: str, as_json: bool, quick: bool, only: str, output: Path | None) -> None:
    """Benchmark the backend URL names against its raw client and tooz, interleaved in one run.

    Prints p50/p99 latencies, throughput, ratios and whether each target holds
    (see docs/performance.md). Exit status 1 if a workload produced no numbers;
    targets that do not hold are reported, not an error.
    """
    runner, report = _load("runner"), _load("report")
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
