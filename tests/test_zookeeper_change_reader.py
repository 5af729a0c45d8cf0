"""ZooKeeper: a group's re-read after its roster's child watch fired is the watch's re-arm (payloads
inline: nothing else is read), a listing older than a membership already returned is never
returned, and payloads too large for the roster are read from the members' claims. A candidate
that takes over reads the election once: its own term came with its nomination."""

from __future__ import annotations

import itertools
import threading
import uuid
from typing import Any

from zookeeper_support import backend_of

import consensus_api as ca
from consensus_backends.zookeeper.layout import decode_name
from consensus_backends.zookeeper.membership import ROSTER_INLINE, parse_roster_name, roster_name
from consensus_testkit import ServerHandle
from consensus_testkit.conformance.helpers import EventLog

TIMEOUT = 10.0


class ListingCount:
    """Counts the session's children reads that set no watch (a re-arm sets one)."""

    def __init__(self, client: Any) -> None:
        self.calls = 0
        self._get_children_async = client.get_children_async
        client.get_children_async = self

    def __call__(self, path: str, watch: Any = None, include_data: bool = False) -> Any:
        if watch is None:
            self.calls += 1
        return self._get_children_async(path, watch=watch, include_data=include_data)


def _settle(session: ca.Session) -> None:
    """Wait until the dispatcher has run what is queued (the re-read the watch's first arm asks for)."""
    done = threading.Event()
    session._dispatcher.submit(done.set)
    assert done.wait(TIMEOUT)


def test_membership_rereads_start_from_the_rearm(zookeeper_server: ServerHandle) -> None:
    url = f"{zookeeper_server.url}/zk-reread-{uuid.uuid4().hex[:8]}"
    with ca.connect(url) as watcher, ca.connect(url) as joiner:
        log = EventLog[ca.MembershipChanged]("memberships")
        joiner.group("g").join("m0", b"data 0")  # the group's znodes exist from here on
        watcher.group("g").add_listener(log)
        log.wait_count(1, TIMEOUT)  # the first event: a linearizable read
        _settle(watcher)
        listings = ListingCount(backend_of(watcher)._connection.client)
        for number in range(1, 10):
            joiner.group("g").join(f"m{number}", f"data {number}".encode())
            log.wait_last(lambda event: f"m{number}" in event.members, TIMEOUT)  # noqa: B023
            _settle(watcher)
        assert listings.calls == 0  # every re-read's listing was the re-arm's reply
        seen = [frozenset(event.members) for event in log.events]
        assert all(earlier <= later for earlier, later in itertools.pairwise(seen)), seen
        assert watcher.group("g").membership() == {f"m{n}": f"data {n}".encode() for n in range(10)}


def test_a_rearm_older_than_a_returned_membership_is_not_returned(zookeeper_server: ServerHandle) -> None:
    url = f"{zookeeper_server.url}/zk-reread-{uuid.uuid4().hex[:8]}"
    with ca.connect(url) as watcher, ca.connect(url) as joiner:
        log = EventLog[ca.MembershipChanged]("memberships")
        watcher.group("g").add_listener(log)
        backend = backend_of(watcher)
        groups, client = backend._groups, backend._connection.client
        joiner.group("g").join("a", b"1")
        roster = backend._layout.roster("g")
        stale = client.get_children_async(roster, include_data=True)
        assert stale.get(TIMEOUT)[0] == [roster_name("a", b"1")]
        joiner.group("g").join("b", b"2")
        # the listener's own re-reads are done: no re-arm is pending
        log.wait_last(lambda event: set(event.members) == {"a", "b"}, TIMEOUT)
        _settle(watcher)
        assert backend.membership("g") == {"a": b"1", "b": b"2"}  # linearizable: newer than ``stale``

        groups.listed("g", stale)
        listings = ListingCount(client)
        assert backend.change_reader().membership("g") == {"a": b"1", "b": b"2"}
        assert listings.calls == 1  # the stale listing's pzxid is older: listed again

        fresh = client.get_children_async(roster, include_data=True)
        groups.listed("g", fresh)
        assert backend.change_reader().membership("g") == {"a": b"1", "b": b"2"}
        assert listings.calls == 2  # ``fresh`` served as the listing (counted when it was sent)


def test_roster_names_carry_small_payloads_and_any_member_id() -> None:
    for member_id in ["m", "a~b~", "~", "x/y%z", "é~*"]:
        for data in [b"", b"\x00~*=", bytes(range(ROSTER_INLINE))]:
            name = roster_name(member_id, data)
            assert "/" not in name
            encoded, inline = parse_roster_name(name) or ("", None)
            assert (decode_name(encoded), inline) == (member_id, data)
        encoded, inline = parse_roster_name(roster_name(member_id, bytes(ROSTER_INLINE + 1))) or ("", b"")
        assert (decode_name(encoded), inline) == (member_id, None)  # read from the claim
    assert parse_roster_name("no-separator") is None


def test_large_payloads_are_read_from_the_claims_beside_inline_ones(zookeeper_server: ServerHandle) -> None:
    url = f"{zookeeper_server.url}/zk-reread-{uuid.uuid4().hex[:8]}"
    large = bytes(range(256)) * 8
    with ca.connect(url) as watcher, ca.connect(url) as joiner:
        log = EventLog[ca.MembershipChanged]("memberships")
        watcher.group("g").add_listener(log)
        joiner.group("g").join("small", b"s")
        joiner.group("g").join("large", large)
        log.wait_last(lambda event: set(event.members) == {"small", "large"}, TIMEOUT)
        assert dict(log.events[-1].members) == {"small": b"s", "large": large}
        assert watcher.group("g").membership() == {"small": b"s", "large": large}
        joiner.group("g").leave("large")
        log.wait_last(lambda event: set(event.members) == {"small"}, TIMEOUT)
        assert watcher.group("g").membership() == {"small": b"s"}


class ExistsCount:
    """Counts the session's ``exists`` requests."""

    def __init__(self, client: Any) -> None:
        self.calls = 0
        self._exists_async = client.exists_async
        client.exists_async = self

    def __call__(self, path: str, watch: Any = None) -> Any:
        self.calls += 1
        return self._exists_async(path, watch=watch)


def test_a_candidate_that_takes_over_reads_the_election_once(zookeeper_server: ServerHandle) -> None:
    url = f"{zookeeper_server.url}/zk-reread-{uuid.uuid4().hex[:8]}"
    with ca.connect(url) as leader, ca.connect(url) as follower:
        assert backend_of(leader).nominate("svc", "a")
        assert not backend_of(follower).nominate("svc", "b")  # its own term is read here, once
        term_of_a = backend_of(follower).leadership("svc")
        backend_of(leader).resign("svc", "a")
        reader = backend_of(follower).change_reader()
        exists = ExistsCount(backend_of(follower)._connection.client)
        took_over = reader.leadership("svc")
        assert exists.calls == 0  # the term came with the nomination: one listing, no second request
        assert took_over is not None and term_of_a is not None
        assert (took_over.leader_id, took_over.term > term_of_a.term) == ("b", True)
        assert took_over == backend_of(follower).leadership("svc")  # the term a fresh read finds
