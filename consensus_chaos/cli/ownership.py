"""``consensus ownership``: check resource ownership in coordinator histories (``consensus chaos
--workload coordinator``): no resource owned by two members at once, every resource owned at the end."""

from __future__ import annotations

from pathlib import Path

import click

from consensus_api.cli._common import echo_json, err_console, out_console
from consensus_chaos.check.ownership import check_local, check_spark
from consensus_chaos.check.spark import spark_session


@click.command("ownership")
@click.argument("directory", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option(
    "--engine",
    type=click.Choice(["spark", "local"]),
    default="spark",
    show_default=True,
    help="spark: one Spark task per run; local: in this process.",
)
@click.option("--master", default="local[*]", show_default=True, help="Spark master URL.")
@click.option("--json", "as_json", is_flag=True, help='Print {"ok", "findings": [{"run", "resource", ...}]}.')
def ownership(directory: Path, engine: str, master: str, as_json: bool) -> None:
    """Check the coordinator histories in DIRECTORY. Exit 1 naming each resource that was owned by
    two members at once (a member paused or expired by the nemesis is reported, not a violation),
    or that no member, or two, owned at the end."""
    findings = check_spark(directory, spark_session(master)) if engine == "spark" else check_local(directory)
    violations = [f for f in findings if f.violation]
    if as_json:
        echo_json(
            {
                "ok": not violations,
                "findings": [
                    {"run": f.run, "resource": f.resource, "finding": f.finding, "detail": f.detail}
                    for f in findings
                ],
            }
        )
    else:
        for finding in findings:
            style = "red" if finding.violation else "yellow"
            line = f"{finding.finding} {finding.resource} (run {finding.run}): {finding.detail}"
            (err_console() if finding.violation else out_console()).print(line, style=style, markup=False)
        out_console().print(
            "ownership: ok" if not violations else f"ownership: {len(violations)} violation(s)",
            markup=False,
        )
    if violations:
        raise SystemExit(1)
