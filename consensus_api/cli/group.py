"""``consensus group describe``: a coordinated group's mode, state, generation and members, as
``kafka-consumer-groups --describe`` shows a consumer group."""

from __future__ import annotations

import click
from rich.table import Table
from rich.text import Text

from consensus_api.cli._common import echo_json, open_session, out_console, show_bytes, show_text, url_option


@click.group("group")
def group() -> None:
    """Coordinated groups (session.coordinator, ResourceHandler, incremental_coordinator)."""


@group.command("describe")
@click.argument("name")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help='Print {"group", "mode", "state", "generation", "protocol", "protocol_type", "members": '
    '[{"member", "instance", "epoch", "resources", "assignment"}]}; assignment is hex, or null when '
    "resources lists the member's resources.",
)
@url_option
def describe(name: str, as_json: bool, url: str | None) -> None:
    """Show group NAME: mode (eager, cooperative, classic, incremental or empty), state, generation
    or group epoch, protocol, and each member with its instance id, epoch and assignment."""
    with open_session(url, read_only=True) as session:
        described = session.describe_group(name)
    if as_json:
        echo_json(described.as_json())
        return
    generation = "-" if described.generation is None else str(described.generation)
    title = (
        f"group {show_text(name)}: {described.mode}, {described.state}, generation {generation}, "
        f"protocol {show_text(described.protocol or '-')}"
    )
    if not described.members:
        click.echo(f"{title}; no members")
        return
    table = Table(title=Text(title), title_justify="left")
    for column in ("member", "instance", "epoch", "assignment"):
        table.add_column(column)
    for member in described.members:
        if member.resources is not None:
            assignment = " ".join(member.resources)
        else:
            assignment = "-" if member.assignment is None else show_bytes(member.assignment)
        table.add_row(
            Text(show_text(member.member_id)),
            Text(show_text(member.instance_id or "-")),
            "-" if member.epoch is None else str(member.epoch),
            Text(show_text(assignment)),
        )
    out_console().print(table)
