"""``consensus elect``: campaign for the leadership of a service, printing
its changes or running a command only while leading, as ``etcdctl elect`` does, with the term.

Contract: <https://consensus-api.github.io/consensus-api/spec/#7-leaderelection-kip-30-leaderelectionclient>
"""

from __future__ import annotations

import os
import queue
import threading
import time
from types import FrameType

import click

from consensus_api.cli._child import (
    EXIT_LOST,
    exit_by_signal,
    grace_option,
    on_signals,
    run_command,
)
from consensus_api.cli._common import (
    EXIT_FAILURE,
    as_json,
    describe,
    json_text,
    open_session,
    print_error,
    resolved_url,
    url_option,
)
from consensus_api.model import LeaderChanged, SessionState

EXIT_HELP = f"""\b
Exit status with CMD:
  CMD's own      CMD ran and exited while leading (128+N: signal N ended it)
  {EXIT_FAILURE}              not elected within --timeout, or the session was lost first (CMD did not run)
  2              a usage or configuration error, or the backend was unreachable
  {EXIT_LOST}              the leadership was lost while CMD ran; CMD was stopped
  126, 127       CMD could not be run, or was not found
  128+N          signal N ended the campaign
Without CMD: 0 after --timeout or SIGINT/SIGTERM; 1 if a live candidate already has ID.
"""


@click.command("elect", epilog=EXIT_HELP)
@click.argument("service")
@click.argument("candidate_id", metavar="ID")
@click.argument("command", nargs=-1, metavar="[-- CMD...]")
@click.option(
    "--json",
    "as_json_lines",
    is_flag=True,
    help='Without CMD: one {"type", "service", "leader", "term", "leading"} object per line.',
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0),
    default=None,
    metavar="S",
    help="With CMD: give up when not leading after S seconds (exit 1). Without: exit 0 after S seconds.",
)
@grace_option
@url_option
def elect(
    *,
    service: str,
    candidate_id: str,
    command: tuple[str, ...],
    as_json_lines: bool,
    timeout: float | None,
    grace: float,
    url: str | None,
) -> None:
    """Campaign as candidate ID for the leadership of SERVICE.

    Without CMD: print the leader and term now and at every change ("(leading)"
    when ID leads) until --timeout or Ctrl-C, then resign. After a session loss
    the candidacy is nominated again (auto_rejoin).

    With CMD: once ID leads, run CMD with CONSENSUS_SERVICE, CONSENSUS_LEADER_ID,
    CONSENSUS_TERM (the fencing token: terms strictly increase across leaders)
    and CONSENSUS_URL in its environment; when CMD exits, resign and pass its
    status through. CMD runs through connection trouble (SUSPENDED) while the
    session lives; when the leadership ends (the session lost, e.g. this
    process paused past session_timeout or cut off that long, or another
    leader or term reported), CMD gets SIGTERM at once, then SIGKILL after
    --grace seconds, and the command exits 3 without campaigning again. Until
    the loss is seen CMD may overlap with the next leader: fence writes with
    the term. Put -- before CMD when it has options.
    """
    if command and as_json_lines:
        raise click.UsageError("--json prints leadership changes, which only happens without CMD")
    if command:
        _lead(service, candidate_id, command, timeout=timeout, grace=grace, url=url)
    else:
        _observe(service, candidate_id, as_json_lines, timeout, url)


class _Campaign:
    """One candidate's campaign, as its session's dispatcher thread reports it: elected at a term,
    then lost when another leader or term is reported or the session is lost."""

    def __init__(self, candidate_id: str) -> None:
        self._candidate_id = candidate_id
        self.term: int | None = None
        #: Set once elected, or once the session was lost before that (``term`` stays None).
        self.decided = threading.Event()
        self.lost = threading.Event()

    def on_event(self, event: LeaderChanged) -> None:
        if self.term is None:
            if event.leader_id == self._candidate_id and event.term is not None and not self.decided.is_set():
                self.term = event.term
                self.decided.set()
        elif (event.leader_id, event.term) != (self._candidate_id, self.term):
            self.lost.set()

    def on_state(self, state: SessionState) -> None:
        if state is SessionState.LOST:
            self.lost.set()
            self.decided.set()


def _lead(
    service: str,
    candidate_id: str,
    command: tuple[str, ...],
    *,
    timeout: float | None,
    grace: float,
    url: str | None,
) -> None:
    campaign = _Campaign(candidate_id)
    with on_signals(exit_by_signal), open_session(url, auto_rejoin=False) as session:
        session.add_state_listener(campaign.on_state)
        election = session.election(service)
        election.add_listener(campaign.on_event)
        if election.nominate(candidate_id) and timeout is not None:
            timeout = max(timeout, session.settings.request_timeout)  # its first event will tell the term
        elected = campaign.decided.wait(timeout)
        term = campaign.term
        if term is None:
            why = "the session was lost" if elected else f"not elected within {timeout:g} s"
            print_error(f"{candidate_id!r} does not lead {service!r}: {why}")
            raise SystemExit(EXIT_FAILURE)
        env = {
            **os.environ,
            "CONSENSUS_URL": resolved_url(url),
            "CONSENSUS_SERVICE": service,
            "CONSENSUS_LEADER_ID": candidate_id,
            "CONSENSUS_TERM": str(term),
        }
        why = f"{candidate_id!r} lost the leadership of {service!r} (term {term}); CMD was stopped"
        status = run_command(command, env, campaign.lost, grace, why)
    raise SystemExit(status)


def _observe(
    service: str, candidate_id: str, as_json_lines: bool, timeout: float | None, url: str | None
) -> None:
    events: queue.Queue[LeaderChanged] = queue.Queue()
    stop = threading.Event()

    def request_stop(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    deadline = None if timeout is None else time.monotonic() + timeout
    with on_signals(exit_by_signal), open_session(url) as session:
        election = session.election(service)
        election.nominate(candidate_id)
        election.add_listener(events.put)
        with on_signals(request_stop):
            _print_changes(events, candidate_id, as_json_lines, stop, deadline)


def _print_changes(
    events: queue.Queue[LeaderChanged],
    candidate_id: str,
    as_json_lines: bool,
    stop: threading.Event,
    deadline: float | None,
) -> None:
    while not stop.is_set():
        wait = 0.2 if deadline is None else min(0.2, deadline - time.monotonic())
        if wait <= 0:
            break
        try:
            event = events.get(timeout=wait)
        except queue.Empty:
            continue
        leading = event.leader_id == candidate_id
        if as_json_lines:
            click.echo(json_text({**as_json(event), "leading": leading}))
        else:
            click.echo(describe(event) + (" (leading)" if leading else ""))
