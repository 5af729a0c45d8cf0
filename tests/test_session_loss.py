"""A join or nomination overtaken by a real session loss (server-side expiry on SQLite).

The backend call is held open (by a wrapper around the real backend's method)
across the loss, the interleaving a client process paused mid-call meets
(found by a chaos run on etcd). Either the call returns between LOST and
CONNECTED (the state listener holds the dispatcher until the call has
returned) or only once the session is CONNECTED again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import consensus_api as ca
from consensus_testkit.faults import expire_session

TIMEOUT = 10.0
#: How long after the positive control a wrong re-join would have shown.
QUIET = 1.0


@contextmanager
def overtaken(session: ca.Session, method: str, returns_when: ca.SessionState) -> Iterator[None]:
    """While open, the backend's ``method`` returns only once the session's loss reached
    ``returns_when`` (LOST, or CONNECTED again); later calls (re-joins) pass straight through."""
    backend = session._backend
    call = getattr(backend, method)
    states: list[ca.SessionState] = []
    reached, returned, first = threading.Event(), threading.Event(), threading.Lock()

    def on_state(state: ca.SessionState) -> None:
        states.append(state)
        if state is returns_when and ca.SessionState.LOST in states:
            reached.set()
            if state is ca.SessionState.LOST:  # hold CONNECTED back until the call returned
                returned.wait(TIMEOUT)

    def held(*args: object) -> object:
        result = call(*args)
        if first.acquire(blocking=False):
            session.add_state_listener(on_state)
            expire_session(session)
            assert reached.wait(TIMEOUT), f"the session went {states}, not LOST then {returns_when}"
        return result

    setattr(backend, method, held)
    try:
        yield
    finally:
        returned.set()
        delattr(backend, method)


def _eventually(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


WHEN = [ca.SessionState.LOST, ca.SessionState.CONNECTED]


def _join(session: ca.Session) -> None:
    session.group("g").join("m")


def _nominate(session: ca.Session) -> None:
    session.election("s").nominate("c")


def _joined(observer: ca.Session) -> bool:
    return observer.group("g").members() == {"m"}


def _nominated(observer: ca.Session) -> bool:
    lead = observer.election("s").leadership()
    return lead is not None and lead.leader_id == "c"


KINDS = {"join": (_join, _joined), "nominate": (_nominate, _nominated)}


@pytest.mark.parametrize("method", sorted(KINDS))
@pytest.mark.parametrize("returns_when", WHEN, ids=lambda s: f"returns-when-{s.name}")
@pytest.mark.parametrize("auto_rejoin", [False, True], ids=["no-rejoin", "auto-rejoin"])
def test_overtaken_by_a_loss(
    tmp_path: Path, method: str, auto_rejoin: bool, returns_when: ca.SessionState
) -> None:
    """What a loss overtook is joined again with auto_rejoin, and stays gone without it."""
    call, visible = KINDS[method]
    url = f"sqlite:///{tmp_path / 'c.db'}"
    with (
        ca.connect(url, session_timeout=1.5, auto_rejoin=auto_rejoin) as session,
        ca.connect(url) as observer,
    ):
        with overtaken(session, method, returns_when):
            call(session)
        if auto_rejoin:
            _eventually(lambda: visible(observer), f"the {method} was not made again")
        else:
            _still_flowing(session, observer)
            time.sleep(QUIET)  # a wrong re-join comes at once, from the dispatcher
            assert not visible(observer)


def _still_flowing(session: ca.Session, observer: ca.Session) -> None:
    """The positive control beside "nothing re-joined": after the loss the session's dispatcher delivers
    (a value listener sees its write) and the observer sees what the session joins now."""
    values: list[ca.ValueChanged] = []
    session.listeners.add_value_listener("control/k", values.append)
    version = session.storage.put("control/k", b"after the loss")
    _eventually(lambda: any(event.version == version for event in values), "the control write arrived")
    session.group("control").join("m")
    _eventually(lambda: observer.group("control").members() == {"m"}, "the control join is seen")
