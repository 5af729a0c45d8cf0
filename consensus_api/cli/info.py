"""``consensus members`` and ``consensus leader``: who is in a group, who leads a service."""

from __future__ import annotations

import click
from rich.table import Table
from rich.text import Text

from consensus_api.cli._common import (
    echo_json,
    member_list,
    open_session,
    out_console,
    show_bytes,
    show_text,
    url_option,
)


@click.command("members")
@click.argument("group")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help='Print {"group", "members": [{"member", "data", "encoding"}]}: data is UTF-8 text '
    '("encoding": "utf-8") when valid, else base64 ("encoding": "base64").',
)
@url_option
def members(group: str, as_json: bool, url: str | None) -> None:
    """Show the live members of GROUP and their data (control characters escaped, e.g. \\x1b)."""
    with open_session(url, read_only=True) as session:
        membership = session.group(group).membership()
    if as_json:
        echo_json({"group": group, "members": member_list(membership)})
        return
    if not membership:
        click.echo(f"no members in {show_text(group)}")
        return
    table = Table(title=Text(f"group {show_text(group)}"), title_justify="left")
    table.add_column("member")
    table.add_column("data")
    for member_id in sorted(membership):
        table.add_row(Text(show_text(member_id)), Text(show_bytes(membership[member_id])))
    out_console().print(table)


@click.command("leader")
@click.argument("service")
@click.option(
    "--json", "as_json", is_flag=True, help='Print {"service", "leader", "term"} (null: no leader).'
)
@url_option
def leader(service: str, as_json: bool, url: str | None) -> None:
    """Show the leader of SERVICE and its term, or "no leader"."""
    with open_session(url, read_only=True) as session:
        leadership = session.election(service).leadership()
    if as_json:
        leader_id, term = (None, None) if leadership is None else (leadership.leader_id, leadership.term)
        echo_json({"service": service, "leader": leader_id, "term": term})
    elif leadership is None:
        click.echo("no leader")
    else:
        click.echo(f"leader: {show_text(leadership.leader_id)} term: {leadership.term}")
