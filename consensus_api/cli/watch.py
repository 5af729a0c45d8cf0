"""``consensus watch``: print the events of a key or a namespace (<https://consensus-api.github.io/consensus-api/spec/#5-listenerregistry-kip-30-listenerregistry>)."""

from __future__ import annotations

import queue
import time

import click

from consensus_api.cli._common import as_json, describe, json_text, open_session, url_option
from consensus_api.model import KeySetChanged, ValueChanged


@click.command("watch")
@click.argument("key", required=False)
@click.option(
    "--namespace",
    "-n",
    metavar="NS",
    default=None,
    help="Watch the key set one level below NS instead of a key ('' is the root).",
)
@click.option("--count", "-c", type=click.IntRange(min=1), default=None, help="Exit after N events.")
@click.option(
    "--timeout",
    "-t",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Exit (status 0) after S seconds.",
)
@click.option(
    "--json",
    "as_json_lines",
    is_flag=True,
    help="One JSON object per line and event; a value is UTF-8 text with "
    '"encoding": "utf-8" when valid, else base64 with "encoding": "base64".',
)
@url_option
def watch(
    *,
    key: str | None,
    namespace: str | None,
    count: int | None,
    timeout: float | None,
    as_json_lines: bool,
    url: str | None,
) -> None:
    """Print every change of KEY (or of the keys below --namespace) as a line.

    The first line is the current state ("KEY absent" for a key that does not
    exist; "KEY deleted" once a key seen is gone). Runs until Ctrl-C, --count
    events or --timeout. Never creates a SQLite database file.
    """
    if (key is None) == (namespace is None):
        raise click.UsageError("give either KEY or --namespace NS (not both)")
    events: queue.Queue[ValueChanged | KeySetChanged] = queue.Queue()
    deadline = None if timeout is None else time.monotonic() + timeout
    seen = 0
    present = False  # whether the last event showed the key with a value
    with open_session(url, read_only=True) as session:
        if key is not None:
            session.listeners.add_value_listener(key, events.put)
        else:
            session.listeners.add_keyset_listener(namespace or "", events.put)
        try:
            while count is None or seen < count:
                wait = 0.2 if deadline is None else min(0.2, deadline - time.monotonic())
                if wait <= 0:
                    break
                try:
                    event = events.get(timeout=wait)
                except queue.Empty:
                    continue
                if as_json_lines:
                    click.echo(json_text(as_json(event)))
                else:
                    click.echo(describe(event, was_present=present))
                present = isinstance(event, ValueChanged) and event.value is not None
                seen += 1
        except KeyboardInterrupt:
            pass
