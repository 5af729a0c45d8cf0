"""``consensus members`` and ``consensus leader``: who is in a group, who leads a service."""

from __future__ import annotations

import click
from rich.table import Table
from rich.text import Text

from consensus_api.cli._common import open_session, out_console, show_bytes, url_option


@click.command("members")
@click.argument("group")
@url_option
def members(group: str, url: str | None) -> None:
    """Show the live members of GROUP and their data."""
    with open_session(url) as session:
        membership = session.group(group).membership()
    if not membership:
        click.echo(f"no members in {group}")
        return
    table = Table(title=Text(f"group {group}"), title_justify="left")
    table.add_column("member")
    table.add_column("data")
    for member_id in sorted(membership):
        table.add_row(Text(member_id), Text(show_bytes(membership[member_id])))
    out_console().print(table)


@click.command("leader")
@click.argument("service")
@url_option
def leader(service: str, url: str | None) -> None:
    """Show the leader of SERVICE and its term, or "no leader"."""
    with open_session(url) as session:
        leadership = session.election(service).leadership()
    if leadership is None:
        click.echo("no leader")
    else:
        click.echo(f"leader: {leadership.leader_id} term: {leadership.term}")
