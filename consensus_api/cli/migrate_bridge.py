"""``consensus migrate cutover|rollback|status``: hand authority between the stores of a bridged
migration, take it back, or show where it stands (docs/migration.md).

Exit status: 0 done; 1 refused (the message says why: unbridged sessions, data not in sync, writes
accepted since the cut-over, ...); 2 usage, configuration or an unreachable store.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import click
from rich.table import Table
from rich.text import Text

from consensus_api.cli._common import echo_json, err_console, expand_url, out_console, show_text
from consensus_api.migrate import MigrationStatus
from consensus_api.migrate import cutover as run_cutover
from consensus_api.migrate import rollback as run_rollback
from consensus_api.migrate import status as read_status


def _stores(command: Callable[..., Any]) -> Callable[..., Any]:
    command = click.option("--to", "target", required=True, metavar="URL", help="The new store.")(command)
    return click.option("--from", "source", required=True, metavar="URL", help="The old store.")(command)


def _urls(source: str, target: str) -> tuple[str, str]:
    return expand_url(source) or source, expand_url(target) or target


@click.command("cutover")
@_stores
@click.option(
    "--force", is_flag=True, help="Proceed where the old store cannot list its live sessions (you checked)."
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0.1),
    default=60.0,
    show_default=True,
    help="Seconds the sealed old store may wait for the new one to catch up before giving up.",
)
@click.option(
    "--max-lag",
    type=click.IntRange(min=0),
    default=1000,
    show_default=True,
    help="Differences between the stores tolerated before sealing (in sync: at most this many).",
)
def cutover(source: str, target: str, force: bool, timeout: float, max_lag: int) -> None:
    """Seal the old store, bring the new one up to date, raise its term floor and hand it authority.

    Refused while a live session on the old store is not bridged or the data is
    not in sync. Bridged sessions then move over by themselves.
    """
    old, new = _urls(source, target)
    started = time.monotonic()
    marker = run_cutover(old, new, force=force, timeout=timeout, max_lag=max_lag)
    out_console().print(
        f"cut over in {time.monotonic() - started:.1f} s: the new store has authority "
        f"(term floor {marker.floor}); bridged sessions are moving",
        soft_wrap=True,
    )


@click.command("rollback")
@_stores
def rollback(source: str, target: str) -> None:
    """Hand authority back to the old store, while the new one has accepted no write since the cut-over."""
    old, new = _urls(source, target)
    run_rollback(old, new)
    out_console().print(
        "rolled back: the old store has authority again; bridged sessions are moving", soft_wrap=True
    )


@click.command("status")
@_stores
@click.option("--json", "as_json", is_flag=True, help="One JSON document on stdout.")
def status(source: str, target: str, as_json: bool) -> None:
    """Show the phase, the authority, bridged and unbridged sessions, the lag and the term floors."""
    old, new = _urls(source, target)
    found = read_status(old, new)
    if as_json:
        echo_json(found.as_json())
        return
    _table(found)


def _table(found: MigrationStatus) -> None:
    table = Table(title="migration", show_header=True)
    table.add_column("")
    table.add_column("old store")
    table.add_column("new store")
    mark = {True: "<- authority", False: ""}
    table.add_row("authority", mark[found.authority == "old"], mark[found.authority == "new"])
    table.add_row("sealed", str(found.sealed_old), str(found.sealed_new))
    table.add_row("term floor", str(found.floor_old), str(found.floor_new))
    table.add_row("bridged sessions", _sessions(found.bridged_old), _sessions(found.bridged_new))
    unbridged = "cannot be listed" if found.unbridged is None else _names(found.unbridged)
    table.add_row("unbridged sessions", unbridged, "")
    out = out_console()
    out.print(Text(f"phase: {found.phase}", style="bold"), soft_wrap=True)
    out.print(table)
    lag = "in sync" if found.lag == 0 else f"{found.lag} keys differ"
    out.print(f"data: {lag}", soft_wrap=True)
    if found.unbridged:
        err_console().print(
            Text(f"{len(found.unbridged)} live sessions on the old store are not bridged", style="yellow"),
            soft_wrap=True,
        )


def _sessions(entries: list[dict[str, Any]]) -> str:
    lines = [f"{entry.get('host')}:{entry.get('pid')} {entry.get('role', 'client')}" for entry in entries]
    return _names(lines)


def _names(names: list[str]) -> str:
    if not names:
        return "none"
    shown = "\n".join(show_text(str(name)) for name in names[:10])
    return shown + (f"\n... {len(names) - 10} more" if len(names) > 10 else "")
