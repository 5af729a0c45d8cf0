"""Support for the ``faults`` section (``test_faults.py``): bounds and recorded timings (the prober that
times calls during a fault is ``prober.py``).

Nothing here imports pytest. The bounds the fault tests assert are defined
here, in one place, and documented in ``docs/guarantees.md``:

* a dead or cut-off client's ephemeral state is gone, for observers, within
  ``session_timeout`` + the detection delay of the backend's test profile (+ ``SCHEDULING_SLACK``);
* no API call blocks longer than ``request_timeout + CALL_SLACK`` during a fault.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from consensus_api.errors import ConsensusError, KeyExistsError
from consensus_api.model import (
    KeySetChanged,
    LeaderChanged,
    Leadership,
    MembershipChanged,
    SessionState,
    ValueChanged,
    Versioned,
)
from consensus_api.session import Session
from consensus_testkit.conformance.helpers import EventLog, unique, wait_until
from consensus_testkit.conformance.prober import CALL_SLACK, Prober
from consensus_testkit.profile import profile_for

if TYPE_CHECKING:
    from consensus_testkit.conformance.worker import WorkerProcess  # the worker runs a Prober

#: Short timeouts keep the section fast: the options of every session a fault test opens.
SESSION_TIMEOUT = 3.0
REQUEST_TIMEOUT = 3.0
FAULT_OPTIONS: dict[str, object] = {
    "session_timeout": SESSION_TIMEOUT,
    "request_timeout": REQUEST_TIMEOUT,
    "connect_timeout": 15,
}

CALL_LIMIT = REQUEST_TIMEOUT + CALL_SLACK


class Record(Protocol):
    """``record(measure, seconds, note="")``: keeps a timing of the running test."""

    def __call__(self, measure: str, seconds: float, note: str = "") -> None: ...


#: Added to every liveness bound: a loaded 2-core CI machine runs five backends at once.
SCHEDULING_SLACK = 2.0


def loss_bound(session: Session, session_timeout: float) -> float:
    """The bound the fault tests give a loss to show: ``session_timeout`` + the detection delay the
    test profile of ``session``'s backend declares + ``SCHEDULING_SLACK``."""
    return session_timeout + profile_for(session.url).detection_delay(session_timeout) + SCHEDULING_SLACK


@dataclass
class Timing:
    """One measured interval of a fault test."""

    backend: str
    test: str
    measure: str
    seconds: float
    note: str = ""


@dataclass
class TimingLog:
    """Every ``Timing`` of the run; written as JSON to ``path`` at the end when one is given."""

    path: Path | None = None
    timings: list[Timing] = field(default_factory=list)

    def record(self, backend: str, test: str, measure: str, seconds: float, note: str = "") -> None:
        """Record that ``measure`` took ``seconds`` in ``test`` on ``backend`` (with a ``note``)."""
        self.timings.append(Timing(backend, test, measure, round(seconds, 3), note))

    def write(self) -> None:
        """Write every timing as a JSON list to ``path`` (if set)."""
        if self.path is not None:
            self.path.write_text(json.dumps([asdict(t) for t in self.timings], indent=1) + "\n")

    def lines(self) -> list[str]:
        """One readable line per timing."""
        return [
            f"{t.backend:<10} {t.test:<48} {t.measure:<38} {t.seconds:7.3f} s {t.note}".rstrip()
            for t in self.timings
        ]


def timed_call(limit: float, call: Callable[[], Any]) -> tuple[Any, BaseException | None, float]:
    """Run ``call``: (its result or None, the ``ConsensusError`` it raised or None, seconds).

    Asserts that it took at most ``limit`` seconds.
    """
    start = time.monotonic()
    error: BaseException | None = None
    result: Any = None
    try:
        result = call()
    except ConsensusError as exc:
        error = exc
    seconds = time.monotonic() - start
    assert seconds <= limit, f"the call blocked {seconds:.2f}s, longer than {limit:g}s (raised {error!r})"
    return result, error, seconds


def not_connected(state: SessionState) -> bool:
    """SUSPENDED or LOST: the session noticed trouble."""
    return state in (SessionState.SUSPENDED, SessionState.LOST)


@dataclass
class Subject:
    """A session under a fault: a member ``m``, the leading candidate ``c``, acknowledged writes and
    listeners on a value, a namespace, the group and the election."""

    session: Session
    ns: str
    group: str = field(default_factory=lambda: unique("ct-group"))
    service: str = field(default_factory=lambda: unique("ct-service"))
    states: EventLog[SessionState] = field(default_factory=lambda: EventLog("state"))
    values: EventLog[ValueChanged] = field(default_factory=lambda: EventLog("value"))
    keysets: EventLog[KeySetChanged] = field(default_factory=lambda: EventLog("keyset"))
    members: EventLog[MembershipChanged] = field(default_factory=lambda: EventLog("members"))
    leaders: EventLog[LeaderChanged] = field(default_factory=lambda: EventLog("leader"))
    acked: dict[str, Versioned] = field(default_factory=dict)
    held: Leadership | None = None
    #: When each state change reached the state listeners (``time.monotonic()``).
    state_times: list[tuple[float, SessionState]] = field(default_factory=list)

    def __post_init__(self) -> None:
        session, storage = self.session, self.session.storage
        session.add_state_listener(self.states)
        session.add_state_listener(lambda state: self.state_times.append((time.monotonic(), state)))
        session.group(self.group).join("m", b"data")
        assert session.election(self.service).nominate("c")
        self.held = session.election(self.service).leadership()
        for index in range(3):
            key, value = f"{self.ns}/before-{index}", f"v{index}".encode()
            self.acked[key] = Versioned(value, storage.put(key, value))
        session.listeners.add_value_listener(f"{self.ns}/after", self.values)
        session.listeners.add_keyset_listener(self.ns, self.keysets)
        session.group(self.group).add_listener(self.members)
        session.election(self.service).add_listener(self.leaders)
        self.keysets.wait_last(lambda event: len(event.keys) == 3, what="the acknowledged keys")
        self.leaders.wait_for(lambda event: event.leader_id == "c", what="the subject leading")

    @property
    def term(self) -> int:
        assert self.held is not None
        return self.held.term

    def probe(self) -> Prober:
        """A prober on this session: times calls and collects acknowledged writes during a fault."""
        return Prober(self.session, self.ns, self.group, self.service)

    def lost(self) -> bool:
        """Whether the session was LOST at some point."""
        return SessionState.LOST in self.states.events

    def noticed(self, since: float) -> float | None:
        """Seconds from ``since`` until the first SUSPENDED or LOST after it reached the listeners."""
        times = [at for at, state in self.state_times if at >= since and not_connected(state)]
        return times[0] - since if times else None


def recovered(subject: Subject, prober: Prober, bound: float, record: Record) -> None:
    """After the fault (``prober`` still running): usable, CONNECTED, the prober's checks
    (``Prober.finish``), every acknowledged write intact, listeners converged, the member and candidacy
    back (with the same term unless the session was LOST)."""
    prober.check()
    since = prober.fault[1]
    session, storage = subject.session, subject.session.storage
    wait_until(lambda: session.state is SessionState.CONNECTED, bound, what="CONNECTED again")
    attempts: list[BaseException | None] = []

    def write() -> int | None:
        key = f"{subject.ns}/after"
        version, error, _ = timed_call(CALL_LIMIT, lambda: storage.put(key, b"after"))
        attempts.append(error)
        if isinstance(error, KeyExistsError) and len(attempts) > 1:  # an earlier failed attempt applied
            stored, _, _ = timed_call(CALL_LIMIT, lambda: storage.fetch(key))
            return stored.version if isinstance(stored, Versioned) and stored.value == b"after" else None
        return version if isinstance(version, int) else None

    written = wait_until(write, bound, what="a write succeeds again", observe=lambda: attempts[-3:])
    states = ",".join(state.name for state in subject.states.events) or "CONNECTED throughout"
    record("fault end -> writable", time.monotonic() - since, note=states)
    prober.finish(bound)
    record("longest call during the fault", prober.longest(), note=f"{len(prober.during())} calls")
    for key, stored in {**subject.acked, **prober.acked}.items():
        assert storage.fetch(key) == stored, f"the acknowledged write of {key} ({stored}) was lost"
    subject.values.wait_last(lambda event: event.version == written and event.value == b"after", bound)
    expected = storage.keys(subject.ns)
    subject.keysets.wait_last(lambda event: event.keys == expected, bound, what=f"keys {sorted(expected)}")
    subject.members.wait_last(lambda event: dict(event.members) == {"m": b"data"}, bound, what="m back")
    election = session.election(subject.service)

    def above_lost_term() -> Leadership | None:
        lead = election.leadership()
        return lead if lead is not None and lead.term > subject.term else None

    if subject.lost():  # a new candidacy at a higher term; the lost session's may linger until it is gone
        now = wait_until(
            above_lost_term,
            bound,
            what=f"a leader at a term above {subject.term} after LOST",
            observe=election.leadership,
        )
    else:
        now = wait_until(election.leadership, bound, what="a leader")
        assert now.term == subject.term, (now, subject.states)
    assert now.leader_id == "c", now
    subject.leaders.wait_last(lambda event: (event.leader_id, event.term) == ("c", now.term), bound)


def survivor_works(prober: Prober, bound: float) -> None:
    """A session that was not itself under the fault (``prober`` on it, still running): the prober's
    checks (``Prober.finish``) and every write it acknowledged is stored."""
    prober.finish(bound)
    storage = prober.session.storage
    for key, stored in prober.acked.items():
        assert storage.fetch(key) == stored, f"the acknowledged write of {key} ({stored}) was lost"


def leading_child(
    spawn: Callable[..., WorkerProcess], group: str, member: str, service: str
) -> tuple[WorkerProcess, int]:
    """A child process that joined ``group`` as ``member`` and leads ``service`` as ``c-<member>``."""
    child = spawn("hold", "--group", group, "--member", member, "--service", service, "--candidate",
                  f"c-{member}", **FAULT_OPTIONS)  # fmt: skip
    _, ready = child.expect("READY", 60)
    assert ready.split()[1] == "leads", ready
    return child, int(ready.split()[2])


def watch_child(
    session: Session, group: str, service: str, member: str
) -> tuple[EventLog[MembershipChanged], EventLog[LeaderChanged]]:
    """Listeners of ``session`` on ``group`` and ``service``, once they saw ``member`` (a
    ``leading_child``) as a member and ``c-<member>`` as the leader."""
    members: EventLog[MembershipChanged] = EventLog("members")
    leaders: EventLog[LeaderChanged] = EventLog("leader")
    session.group(group).add_listener(members)
    session.election(service).add_listener(leaders)
    members.wait_for(lambda event: member in event.members, what=f"{member} as member")
    leaders.wait_for(lambda event: event.leader_id == f"c-{member}", what=f"{member} as leader")
    return members, leaders


def led_by(session: Session, service: str, candidate: str) -> Leadership | None:
    """The leadership of ``service`` if ``candidate`` holds it, else None."""
    leadership = session.election(service).leadership()
    return leadership if leadership is not None and leadership.leader_id == candidate else None


def fenced_lines(child: WorkerProcess, count: int, since: int, bound: float) -> list[str]:
    """The next ``count`` ``FENCED`` report lines of ``child`` at index ``since`` or later."""
    lines, index = [], since
    for _ in range(count):
        index, line = child.expect("FENCED ", bound, since=index)
        lines.append(line)
        index += 1
    return lines
