"""``consensus ping``: is the backend reachable, how fast does it answer, which server is it."""

from __future__ import annotations

import time

import click

from consensus_api.cli._common import echo_json, given_url, open_session, show_text

#: The key the linearizable read fetches; it need not exist.
PING_KEY = "consensus-ping"


@click.command("ping")
@click.argument("url", required=False)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help='Print {"url", "backend", "server_version", "connect_ms", "read_ms"} '
    "(server_version is null when the backend cannot tell).",
)
def ping(url: str | None, as_json: bool) -> None:
    """Connect to URL, make one linearizable read and print the latencies and the server's version.

    URL defaults to --url before the command, then $CONSENSUS_URL, then consensus.toml,
    then sqlite:///consensus.db (which ping never creates). Exit status 2 when the backend
    is unreachable within connect_timeout; on SQLite also while another process holds the
    database's write lock (a process frozen inside a write), and the message names that process.
    """
    began = time.monotonic()
    with open_session(given_url(url), read_only=True) as session:
        connected = time.monotonic()
        session.storage.fetch(PING_KEY)
        read = time.monotonic()
        version = session.server_version()
    report = {
        "url": session.url.redacted(),
        "backend": session.backend,
        "server_version": version,
        "connect_ms": round((connected - began) * 1000, 3),
        "read_ms": round((read - connected) * 1000, 3),
    }
    if as_json:
        echo_json(report)
        return
    server = f"{session.backend} {version}" if version else f"{session.backend} (version unknown)"
    click.echo(
        f"{show_text(session.url.redacted())}: ok, {show_text(server)}, "
        f"connect {report['connect_ms']:.1f} ms, linearizable read {report['read_ms']:.1f} ms"
    )
