"""``consensus kv``: read and write the versioned key-value storage (SPEC section 4)."""

from __future__ import annotations

import click

from consensus_api.cli._common import open_session, read_value, url_option
from consensus_api.errors import KeyNotFoundError

VALUE_HELP = "VALUE is taken as UTF-8 text; '-' reads the value's bytes from stdin."


@click.group("kv")
def kv() -> None:
    """Read and write keys: get, put, update, delete, keys."""


@kv.command("get")
@click.argument("key")
@click.option("--version", "show_version", is_flag=True, help="Also print the version (on a second line).")
@url_option
def get(key: str, show_version: bool, url: str | None) -> None:
    """Print the value of KEY (exit 1 if there is no such key)."""
    with open_session(url) as session:
        current = session.storage.fetch(key)
    if current is None:
        raise KeyNotFoundError(f"no such key: {key!r}")
    click.echo(current.value)
    if show_version:
        click.echo(f"version: {current.version}")


@kv.command("put", epilog=VALUE_HELP)
@click.argument("key")
@click.argument("value")
@url_option
def put(key: str, value: str, url: str | None) -> None:
    """Create KEY with VALUE and print its version (exit 1 if KEY exists)."""
    data = read_value(value)
    with open_session(url) as session:
        version = session.storage.put(key, data)
    click.echo(f"version: {version}")


@kv.command("update", epilog=VALUE_HELP)
@click.argument("key")
@click.argument("value")
@click.option("--version", type=click.IntRange(min=0), default=None, help="Only if KEY is at this version.")
@url_option
def update(key: str, value: str, version: int | None, url: str | None) -> None:
    """Replace the value of KEY and print the new version (exit 1 if missing or at another version)."""
    data = read_value(value)
    with open_session(url) as session:
        new_version = session.storage.update(key, data, version=version)
    click.echo(f"version: {new_version}")


@kv.command("delete")
@click.argument("key")
@click.option("--version", type=click.IntRange(min=0), default=None, help="Only if KEY is at this version.")
@url_option
def delete(key: str, version: int | None, url: str | None) -> None:
    """Delete KEY (exit 1 if missing or at another version)."""
    with open_session(url) as session:
        session.storage.delete(key, version=version)
    click.echo(f"deleted: {key}")


@kv.command("keys")
@click.argument("namespace", default="")
@url_option
def keys(namespace: str, url: str | None) -> None:
    """List the keys exactly one level below NAMESPACE (default: the root), one per line."""
    with open_session(url) as session:
        found = session.storage.keys(namespace)
    for key in sorted(found):
        click.echo(key)
