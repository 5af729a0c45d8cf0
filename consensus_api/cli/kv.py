"""``consensus kv``: read and write the versioned key-value storage (<https://consensus-api.github.io/consensus-api/spec/#4-storage-kip-30-storage>)."""

from __future__ import annotations

import click

from consensus_api.cli._common import (
    echo_json,
    json_bytes,
    open_session,
    read_value,
    show_bytes,
    show_text,
    url_option,
)
from consensus_api.errors import KeyExistsError, KeyNotFoundError
from consensus_api.storage import Storage

#: How often ``kv put`` tries to overwrite while other clients create and delete the key meanwhile.
OVERWRITE_ATTEMPTS = 5

VALUE_HELP = "VALUE is taken as UTF-8 text; '-' reads the value's bytes from stdin."
JSON_HELP = (
    'Print one JSON document. A value is its UTF-8 text with "encoding": "utf-8" when it is valid '
    'UTF-8, else its base64 with "encoding": "base64".'
)


@click.group("kv")
def kv() -> None:
    """Read and write keys: get, put (overwrites, as etcdctl's), update, delete, keys."""


@kv.command("get", epilog=JSON_HELP)
@click.argument("key")
@click.option("--version", "show_version", is_flag=True, help="Also print the version (on a second line).")
@click.option("--raw", is_flag=True, help="Write the value's exact bytes (no newline, no escapes).")
@click.option(
    "--json", "as_json", is_flag=True, help='Print {"key", "version", "value", "encoding"} (see below).'
)
@url_option
def get(key: str, show_version: bool, raw: bool, as_json: bool, url: str | None) -> None:
    """Print the value of KEY (exit 1 if there is no such key).

    Control characters in the value are shown as escapes such as \\x1b (newlines
    and tabs stay); --raw writes the bytes as stored.
    """
    if raw and (as_json or show_version):
        raise click.UsageError("--raw cannot be combined with --json or --version")
    with open_session(url, read_only=True) as session:
        current = session.storage.fetch(key)
    if current is None:
        raise KeyNotFoundError(f"no such key: {key!r}")
    if raw:
        click.echo(current.value, nl=False)
    elif as_json:
        value, encoding = json_bytes(current.value)
        echo_json({"key": key, "version": current.version, "value": value, "encoding": encoding})
    else:
        click.echo(show_bytes(current.value, keep_lines=True))
        if show_version:
            click.echo(f"version: {current.version}")


@kv.command("put", epilog=VALUE_HELP)
@click.argument("key")
@click.argument("value")
@click.option("--create-only", is_flag=True, help="Only create KEY: exit 1 if it exists.")
@click.option(
    "--if-version",
    type=click.IntRange(min=0),
    default=None,
    metavar="N",
    help="Only replace KEY at version N: exit 1 if it is missing or at another version.",
)
@url_option
def put(key: str, value: str, create_only: bool, if_version: int | None, url: str | None) -> None:
    """Set KEY to VALUE, creating or overwriting it, and print the new version.

    --create-only and --if-version make the write conditional (exit 1 when
    the condition does not hold; nothing is written).
    """
    if create_only and if_version is not None:
        raise click.UsageError("--create-only and --if-version cannot be combined")
    data = read_value(value)
    with open_session(url) as session:
        storage = session.storage
        if create_only:
            version = storage.put(key, data)
        elif if_version is not None:
            version = storage.update(key, data, version=if_version)
        else:
            version = _overwrite(storage, key, data)
    click.echo(f"version: {version}")


def _overwrite(storage: Storage, key: str, data: bytes) -> int:
    """Replace ``key``, or create it if missing; a create or delete by another client in between is met
    by trying again (at most ``OVERWRITE_ATTEMPTS`` times, then ``KeyExistsError``)."""
    attempts_left = OVERWRITE_ATTEMPTS
    while True:
        try:
            return storage.update(key, data)
        except KeyNotFoundError:
            pass
        try:
            return storage.put(key, data)
        except KeyExistsError:
            attempts_left -= 1
            if attempts_left == 0:
                raise


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
@click.option("--recursive", "-r", is_flag=True, help="Every key at any depth below NAMESPACE.")
@click.option("--json", "as_json", is_flag=True, help='Print {"namespace", "recursive", "keys": [...]}.')
@url_option
def keys(namespace: str, recursive: bool, as_json: bool, url: str | None) -> None:
    """List the keys exactly one level below NAMESPACE (default: the root), sorted, one per line.

    With --recursive, every key at any depth below it, read page by page (not
    one atomic snapshot: keys written meanwhile may or may not be listed).
    """
    with open_session(url, read_only=True) as session:
        if recursive:
            found = sorted(key for key, _ in session.storage.walk(namespace))
        else:
            found = sorted(session.storage.keys(namespace))
    if as_json:
        echo_json({"namespace": namespace, "recursive": recursive, "keys": found})
        return
    for key in found:
        click.echo(show_text(key))
