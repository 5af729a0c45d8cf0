"""``consensus lock``: run a command while holding a fenced lock, as
``etcdctl lock NAME CMD`` and ``consensus lock PREFIX CMD`` (Consul) do, with the fencing token.

Contract: <https://consensus-api.github.io/consensus-api/spec/#7a-locks>
"""

from __future__ import annotations

import os
import threading

import click

from consensus_api.cli._child import (
    EXIT_LOST,
    exit_by_signal,
    grace_option,
    on_signals,
    run_command,
)
from consensus_api.cli._common import EXIT_FAILURE, open_session, print_error, resolved_url, url_option

EXIT_HELP = f"""\b
Exit status:
  CMD's own      CMD ran and exited (128+N: signal N ended it)
  {EXIT_FAILURE}              the lock was not acquired within --timeout (CMD did not run)
  2              a usage or configuration error, or the backend was unreachable
  {EXIT_LOST}              the lock was lost while CMD ran; CMD was stopped
  126, 127       CMD could not be run, or was not found
  128+N          signal N ended the wait for the lock
"""


@click.command("lock", epilog=EXIT_HELP)
@click.argument("name")
@click.argument("command", nargs=-1, required=True, metavar="-- CMD...")
@click.option("--shared", is_flag=True, help="A shared (reader) lease: excludes only exclusive holders.")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0),
    default=None,
    metavar="S",
    help="Wait at most S seconds in line (exit 1 after). Default: until acquired.",
)
@grace_option
@url_option
def lock(
    *, name: str, command: tuple[str, ...], shared: bool, timeout: float | None, grace: float, url: str | None
) -> None:
    """Hold lock NAME while CMD runs.

    Waits in line for the lock (first come, first served), runs CMD with
    CONSENSUS_LOCK_NAME, CONSENSUS_LOCK_TOKEN (the lease's fencing token:
    tokens strictly increase across holders of NAME) and CONSENSUS_URL in its
    environment, and releases the lock when CMD exits, passing its exit status
    through. Put -- before CMD when it has options.

    The lock lives as long as this process's session. If the session is lost
    while CMD runs (e.g. this process was paused past session_timeout), CMD
    gets SIGTERM as soon as the loss is seen, then SIGKILL after --grace
    seconds: until then CMD may overlap with the next holder, so CMD should
    hand its token to whatever it writes to. If this process dies, the lock
    passes on within session_timeout and CMD gets SIGTERM at once (Linux).
    """
    lost = threading.Event()
    with on_signals(exit_by_signal), open_session(url) as session:
        held = session.lock(name, shared=shared)
        held.add_listener(lambda _lost: lost.set())
        lease = held.acquire(timeout=timeout)
        if lease is None:
            print_error(f"lock {name!r} was not acquired within {timeout:g} s")
            raise SystemExit(EXIT_FAILURE)
        env = {
            **os.environ,
            "CONSENSUS_URL": resolved_url(url),
            "CONSENSUS_LOCK_NAME": name,
            "CONSENSUS_LOCK_TOKEN": str(lease.token),
        }
        why = f"lock {name!r} (token {lease.token}) was lost with the session; CMD was stopped"
        status = run_command(command, env, lost, grace, why)
    raise SystemExit(status)
