"""The ZooKeeper backend after a LOST it did not cause: kazoo's connection thread dead, an earlier
session's ephemerals still there (a real ZooKeeper server).

kazoo ends its connection thread on any error it does not expect, such as
"xids do not match" when a server answers out of order (python-zk/kazoo#254,
seen here when a whole ensemble was paused and resumed): the client then never
reconnects. The backend must report LOST and open a new session. And an
ephemeral of the session before a LOST may outlive it briefly (its close not
yet applied): re-joining must wait for it, not give the id up.
"""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from kazoo.client import KazooClient
from zookeeper_support import backend_of, kazoo_of

import consensus_api as ca
from consensus_api import ConsensusError, MemberExistsError, SessionState
from consensus_testkit import ServerHandle
from consensus_testkit.conformance.helpers import EventLog, wait_until


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # kazoo's thread dies
def test_a_dead_kazoo_connection_thread_is_followed_by_a_new_session(zk_server: ServerHandle) -> None:
    """The next response kazoo reads raises the error of kazoo#254: the session goes LOST, then
    CONNECTED with a new ZooKeeper session, re-joins its member, and calls work again."""
    with ca.connect(f"{zk_server.url}/loop", session_timeout=4, request_timeout=3) as session:
        states: EventLog[SessionState] = EventLog("state")
        session.add_state_listener(states)
        session.group("g").join("m", b"x")
        client = kazoo_of(session)
        old = client.client_id
        handler: Any = client._connection
        original = handler._read_response

        def out_of_order(*args: Any) -> Any:
            handler._read_response = original
            raise RuntimeError("xids do not match, expected %r received %r", 4, 5)

        handler._read_response = out_of_order
        with contextlib.suppress(ConsensusError):  # the call the thread died under: effect unknown
            session.storage.put("k", b"v")
        lost = states.wait_index(lambda state: state is SessionState.LOST, what="LOST")
        states.wait_index(lambda state: state is SessionState.CONNECTED, since=lost, what="CONNECTED")
        assert client.client_id is not None and old is not None and client.client_id[0] != old[0]
        wait_until(lambda: session.group("g").membership() == {"m": b"x"}, what="the member re-joined")
        session.storage.put("after", b"ok")
        assert session.storage.fetch("after") is not None


def test_an_ephemeral_of_an_earlier_session_is_a_passing_error(zk_server: ServerHandle) -> None:
    """A member node left by an earlier session of the same client (not closed yet after a LOST) makes
    a join a passing ConsensusError, retried, not MemberExistsError; once that session is closed, the
    join succeeds. Another session's member is still MemberExistsError."""
    with ca.connect(f"{zk_server.url}/ghost", session_timeout=4, request_timeout=3) as session:
        session.group("g").join("first", b"")  # creates the group's znodes
        backend = backend_of(session)
        earlier = KazooClient(hosts=zk_server.url.split("//")[1], timeout=10)
        earlier.start(10)
        try:
            path = backend._layout.member("g", "m")
            earlier.create(path, b"", ephemeral=True)
            with pytest.raises(MemberExistsError):
                session.group("g").join("m", b"x")  # a stranger's: taken
            backend._connection._past_sessions.add(earlier.client_id[0])  # that session was ours
            with pytest.raises(ConsensusError) as raised:
                session.group("g").join("m", b"x")
            assert not isinstance(raised.value, MemberExistsError), raised.value
        finally:
            earlier.stop()
            earlier.close()
        session.group("g").join("m", b"x")
        assert session.group("g").membership() == {"first": b"", "m": b"x"}
