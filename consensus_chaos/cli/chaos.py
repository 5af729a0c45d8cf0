"""``consensus chaos``: record a history of concurrent clients under faults, for ``consensus check``."""

from __future__ import annotations

from pathlib import Path

import click
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from consensus_api.cli._common import err_console, expand_url, out_console
from consensus_chaos.record.client_process import LOG_LEVELS
from consensus_chaos.record.nemesis import FAULTS
from consensus_chaos.record.runner import WORKLOADS, ChaosOptions, run_chaos
from consensus_testkit import require_launchers, store_names


def _faults(text: str) -> frozenset[str]:
    names = {name.strip() for name in text.split(",") if name.strip()}
    return frozenset() if names == {"none"} else frozenset(names)


@click.command("chaos")
@click.argument("url", required=False)
@click.option(
    "--server",
    type=click.Choice(store_names()),
    default=None,
    help="Start this server (sqlite: a fresh temp file) and run against it; then URL is omitted.",
)
@click.option(
    "--duration", type=click.FloatRange(min=1), default=30, show_default=True, help="Seconds of workload."
)
@click.option("--clients", type=click.IntRange(1, 64), default=5, show_default=True, help="Client processes.")
@click.option(
    "--keys",
    type=click.IntRange(min=1),
    default=2,
    show_default=True,
    help="Keys in use at a time (each rotates every --key-period); at most 8 clients share one.",
)
@click.option(
    "--faults",
    default="kill,pause",
    show_default=True,
    help=f"Comma-separated from {', '.join(FAULTS)}; or none.",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Directory for <run>.parquet (created if missing).",
)
@click.option("--session-timeout", type=click.FloatRange(min=1), default=2.0, show_default=True)
@click.option("--request-timeout", type=click.FloatRange(min=0.5), default=3.0, show_default=True)
@click.option(
    "--key-period",
    type=click.FloatRange(min=0.2),
    default=2.0,
    show_default=True,
    help="Seconds before a key slot moves to a fresh key.",
)
@click.option(
    "--fault-interval",
    type=click.FloatRange(min=0.1),
    default=2.0,
    show_default=True,
    help="Mean seconds between faults.",
)
@click.option(
    "--workload",
    type=click.Choice(sorted(WORKLOADS)),
    default="storage",
    show_default=True,
    help="storage: kv, election and group operations; coordinator: members of one resource group "
    "recording when they own what (checked by consensus ownership); locks: turns at exclusive and "
    "shared fenced locks (checked by consensus check); cutover: counters, an election and a lock on "
    "bridged sessions while the store migrates to --migrate-to / --migrate-server, cut over half-way "
    "(checked by consensus check).",
)
@click.option(
    "--migrate-to",
    default=None,
    help="--workload cutover: the new store's URL ($VAR expanded); the clients connect to URL with "
    "migrate_to= it.",
)
@click.option(
    "--migrate-server",
    type=click.Choice(store_names()),
    default=None,
    help="--workload cutover: start this server as the new store (sqlite: a fresh temp file).",
)
@click.option(
    "--cutover-at",
    type=click.FloatRange(min=0, max=1, min_open=True, max_open=True),
    default=0.5,
    show_default=True,
    help="--workload cutover: when the cut-over starts, as a fraction of --duration.",
)
@click.option(
    "--nodes",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="With --server: start a replicated cluster of this many nodes (odd, at least 3).",
)
@click.option("--seed", type=int, default=None, help="Seed of the workload and fault choices.")
@click.option(
    "--log-level",
    type=click.Choice(LOG_LEVELS),
    default="INFO",
    show_default=True,
    help="The client processes' log (OUT/<run>.log) from this level up; DEBUG adds the client "
    "libraries' INFO records.",
)
def chaos(  # noqa: PLR0917 - click passes every option as a parameter
    url: str | None,
    server: str | None,
    duration: float,
    clients: int,
    keys: int,
    faults: str,
    out: Path,
    session_timeout: float,
    request_timeout: float,
    key_period: float,
    fault_interval: float,
    workload: str,
    nodes: int,
    seed: int | None,
    log_level: str,
    migrate_to: str | None,
    migrate_server: str | None,
    cutover_at: float,
) -> None:
    """Run CLIENTS processes doing random storage, election and membership operations for DURATION
    seconds while faults are injected; record everything in OUT/<run>.parquet.

    Faults: kill (SIGKILL the server or a client process), pause (SIGSTOP it for
    0.5-3 s), restart (kill -9 and restart the server), expire (a real ZooKeeper
    session expiry; elsewhere a client paused past its session timeout). Client
    faults work on every backend; server faults need --server. On a cluster
    (--server zookeeper --nodes 3): leader-kill (SIGKILL the leading node,
    restart it 0.5-2 s later), leader-pause (SIGSTOP it for 0.5-3 s),
    partition (cut a follower off the other nodes for 0.5-3 s); kill, pause
    and restart then act on every node at once.

    --workload cutover: the clients connect bridged (migrate_to=) and the
    run's keys are followed onto the new store; half-way the cut-over moves
    authority to it while kill, pause and restart (of the new store's
    server, else the old one's) go on; at the end the new store's counters
    are read into the history.
    """
    extra = {} if seed is None else {"seed": seed}
    options = ChaosOptions(
        url=expand_url(url),
        server=server,
        duration=duration,
        clients=clients,
        keys=keys,
        faults=_faults(faults),
        out=out,
        session_timeout=session_timeout,
        request_timeout=request_timeout,
        key_period=key_period,
        fault_interval=fault_interval,
        workload=workload,
        nodes=nodes,
        log_level=log_level,
        migrate_to=expand_url(migrate_to),
        migrate_server=migrate_server,
        cutover_at=cutover_at,
        **extra,
    )
    options.validate()
    if server is not None:
        require_launchers([server])
    columns = (TextColumn("chaos"), BarColumn(), TimeElapsedColumn(), TextColumn("{task.fields[status]}"))
    with Progress(*columns, console=err_console(), transient=False) as bar:
        task = bar.add_task("run", total=duration, status="starting")

        def show(elapsed: float, ops: int, applied: int) -> None:
            bar.update(task, completed=min(elapsed, duration), status=f"{ops} ops, {applied} faults")

        result = run_chaos(options, show)
    table = Table(title=f"chaos run {result.run} on {result.backend}")
    table.add_column("what")
    table.add_column("count", justify="right")
    for name, count in sorted(result.counts.items()):
        table.add_row(name, str(count))
    for name, count in sorted(result.faults.items()):
        table.add_row(f"fault {name}", str(count))
    table.add_row("client processes spawned", str(result.spawns))
    table.add_row("seconds", f"{result.seconds:.1f}")
    console = out_console()
    console.print(table)
    for error in result.fault_errors:
        err_console().print(f"fault failed: {error}", style="yellow", markup=False)
    console.print(f"history: {result.path}", markup=False)
