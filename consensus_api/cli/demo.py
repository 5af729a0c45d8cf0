"""``consensus demo``: workers elect a leader, the leader is killed, another takes over with a higher term.

The workers are ``python -m consensus_api.cli.demo_worker NAME`` processes (session_timeout=2),
children of the harness (:mod:`consensus_api.children`: URL in ``$CONSENSUS_URL``, ended by closing
their stdin); this process follows them only through the listeners of its own observer session.
Without a terminal it prints plain lines instead of a live table, so it runs in CI.
"""

from __future__ import annotations

import contextlib
import queue
import sys
import time
from collections.abc import Callable, Iterator

import click
from rich.live import Live
from rich.text import Text

from consensus_api.children import Child, close_all
from consensus_api.cli._common import (
    EXIT_FAILURE,
    err_console,
    out_console,
    resolved_url,
    url_option,
)
from consensus_api.cli._demo_view import DemoState
from consensus_api.cli.demo_worker import CONFIG_KEY, GROUP, SERVICE
from consensus_api.model import Event
from consensus_api.observability import serve_prometheus
from consensus_api.session import connect

LINGER = 1.0  # seconds to keep showing the state once the new leader has written the config
STOP_GRACE = 5.0
#: How long a worker may outlive the demo's ``--duration`` (its lifetime is the sum).
WORKER_MARGIN = 30.0


@click.command("demo")
@url_option
@click.option(
    "--workers", type=click.IntRange(2, 26), default=3, show_default=True, help="Number of worker processes."
)
@click.option(
    "--kill-after",
    type=click.FloatRange(min=0),
    default=5.0,
    show_default=True,
    help="Seconds until the leader's process is SIGKILLed.",
)
@click.option(
    "--duration",
    type=click.FloatRange(min=0, min_open=True),
    default=15.0,
    show_default=True,
    help="Give up (exit 1) if no hand-over was seen by then.",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(1, 65535),
    default=None,
    help="Serve this process's metrics at http://127.0.0.1:PORT/metrics (needs the prometheus extra).",
)
def demo(url: str | None, workers: int, kill_after: float, duration: float, metrics_port: int | None) -> None:
    """Leader election with fencing, live: kill the leader and watch the hand-over.

    Workers join group demo/workers, stand for election in demo/scheduler, and
    the leader writes demo/config fenced by its term. Exit 0 once another
    worker took over with a higher term, 1 if that did not happen in time.
    """
    full_url = resolved_url(url)
    if metrics_port is not None:
        serve_prometheus(metrics_port)
    events: queue.Queue[Event] = queue.Queue()
    with connect(full_url) as observer:
        observer.election(SERVICE).add_listener(events.put)
        observer.group(GROUP).add_listener(events.put)
        observer.listeners.add_value_listener(CONFIG_KEY, events.put)
        with _workers(full_url, workers, duration + WORKER_MARGIN) as processes:
            state = DemoState(started=time.monotonic())
            try:
                _follow(state, events, processes, kill_after, duration)
            except KeyboardInterrupt:
                err_console().print(Text("interrupted", style="yellow"))
                sys.exit(130)
            summary = state.summary()
            if summary is None:
                _report_failure(state, processes, duration)
    click.echo(summary)
    if summary is None:
        sys.exit(EXIT_FAILURE)


def _follow(
    state: DemoState,
    events: queue.Queue[Event],
    processes: dict[str, Child],
    kill_after: float,
    duration: float,
) -> None:
    """Show the state until the hand-over is complete or ``duration`` passed; kill the leader on time."""
    console = out_console()
    live = Live(state.table(state.started), console=console, refresh_per_second=8, transient=False)
    interactive = console.is_terminal
    exited: set[str] = set()
    last_line = ""

    def note(message: str, style: str = "") -> None:
        line = f"[{time.monotonic() - state.started:5.1f}s] {message}"
        if interactive:
            live.console.print(Text(line, style=style))
        else:
            click.echo(line)

    with live if interactive else contextlib.nullcontext():
        while True:
            now = time.monotonic()
            if now - state.started >= duration:
                break
            if state.successor_wrote_at is not None and now - state.successor_wrote_at >= LINGER:
                break
            _drain(events, state, timeout=0.1)
            now = time.monotonic()
            if state.killed is None and now - state.started >= kill_after:
                _kill_leader(state, processes, now, note)
            _note_exits(state, processes, exited, note)
            if interactive:
                live.update(state.table(now))
            elif (line := state.line()) != last_line:
                last_line = line
                note(line)
        if interactive:
            live.update(state.table(time.monotonic()))


def _drain(events: queue.Queue[Event], state: DemoState, timeout: float) -> None:
    try:
        event = events.get(timeout=timeout)
    except queue.Empty:
        return
    while True:
        state.apply(event, time.monotonic())
        try:
            event = events.get_nowait()
        except queue.Empty:
            return


def _kill_leader(
    state: DemoState, processes: dict[str, Child], now: float, note: Callable[..., None]
) -> None:
    leader = state.leader
    if leader is None or leader.leader not in processes:
        return  # nobody (of ours) leads yet: try again on the next round
    worker = processes[leader.leader]
    if worker.returncode is not None:
        return
    worker.kill()
    state.killed, state.killed_at = leader, now
    note(f"SIGKILL leader {leader} (pid {worker.pid})", "bold red")


def _note_exits(
    state: DemoState, processes: dict[str, Child], exited: set[str], note: Callable[..., None]
) -> None:
    for name, worker in processes.items():
        code = worker.returncode
        if code is None or name in exited:
            continue
        exited.add(name)
        if state.killed is None or name != state.killed.leader:
            note(f"worker {name} exited unexpectedly with status {code}", "red")


def _report_failure(state: DemoState, processes: dict[str, Child], duration: float) -> None:
    console = err_console()
    if state.killed is None:
        reason = f"no worker became leader within {duration:g} s"
    else:
        reason = f"no other worker took over from {state.killed} with a higher term within {duration:g} s"
    console.print(Text(f"error: {reason}", style="red"))
    for worker in processes.values():
        console.print(Text(f"--- {worker.name} log ---", style="dim"))
        console.print(Text("\n".join(worker.stderr_tail().splitlines()[-20:])), soft_wrap=True)


@contextlib.contextmanager
def _workers(url: str, count: int, lifetime: float) -> Iterator[dict[str, Child]]:
    """Start ``count`` workers (in sessions of their own, so Ctrl-C reaches only us); stop them all
    after: stdin closed, ``STOP_GRACE`` seconds, then SIGKILL."""
    processes: dict[str, Child] = {}
    try:
        for number in range(1, count + 1):
            name = f"w{number}"
            processes[name] = Child(
                "consensus_api.cli.demo_worker", [name], lifetime=lifetime, url=url, name=name
            )
        yield processes
    finally:
        close_all(processes.values(), STOP_GRACE)
