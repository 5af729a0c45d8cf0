"""The etcd backend's calls against a real server: blocking calls while healthy still end as soon
as the session goes SUSPENDED (their channel is replaced), not at their own deadline."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator

import pytest

import consensus_api as ca
from consensus_testkit import ServerHandle, start_server
from consensus_testkit.conformance.helpers import EventLog

REQUEST_TIMEOUT = 20.0


@pytest.fixture(scope="module")
def server() -> Iterator[ServerHandle]:
    with start_server("etcd") as handle:
        yield handle


class InFlight:
    """``call`` on a thread of its own: when it ended and what it raised."""

    def __init__(self, call: Callable[[], object]) -> None:
        self.ended: float | None = None
        self.error: BaseException | None = None
        self._call = call
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._call()
        except BaseException as exc:  # recorded for the assertions
            self.error = exc
        self.ended = time.monotonic()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)


def test_calls_in_flight_end_when_the_session_is_suspended(server: ServerHandle) -> None:
    url = f"{server.url}/t-{uuid.uuid4().hex[:12]}"
    with ca.connect(url, session_timeout=6, request_timeout=REQUEST_TIMEOUT) as session:
        states: EventLog[ca.SessionState] = EventLog("states")
        session.add_state_listener(states)
        version = session.storage.put("k", b"0")
        server.pause()
        try:
            started = time.monotonic()
            calls = [
                InFlight(lambda: session.storage.fetch("k")),
                InFlight(lambda: session.storage.update("k", b"1", version=version)),
                InFlight(lambda: session.storage.keys("")),
            ]
            index = states.wait_index(lambda state: state is ca.SessionState.SUSPENDED, REQUEST_TIMEOUT)
            suspended = time.monotonic()
            for call in calls:
                call.join(REQUEST_TIMEOUT)
        finally:
            server.resume()
        for call in calls:
            assert isinstance(call.error, ca.OperationTimeoutError), call.error
            assert call.ended is not None
            assert call.ended - suspended < 1.0, f"ended {call.ended - suspended:.2f}s after SUSPENDED"
            assert call.ended - started < REQUEST_TIMEOUT / 2
        states.wait_for(lambda state: state is ca.SessionState.CONNECTED, REQUEST_TIMEOUT, since=index)
        # The replaced channel serves the blocking calls of a healthy session again.
        assert session.storage.fetch("k") is not None
        session.storage.update("k", b"2")
