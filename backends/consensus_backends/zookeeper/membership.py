"""Group membership: per member, an ephemeral claim znode holding its payload, and a roster entry.

Guarantees: ``join`` is one transaction creating the claim ``members/<id>``
(``NodeExistsError`` means a live member holds the id) and the roster entry
``roster/<id>~<payload>`` (the payload inline when at most ``ROSTER_INLINE``
bytes, else ``*``); ``leave`` deletes both in one transaction, and a session's
end deletes both at once. So the roster lists exactly the live members, and a
member lives exactly as long as the ZooKeeper session that created it.
``membership`` is one ``get_children`` of the roster, a consistent snapshot
(linearizable behind the barrier write); members whose payload is not inline
are read from their claims, and the roster's ``pzxid`` is checked unchanged
after that read (else it is read again). The change reader's ``membership``
(not linearizable) takes the reply of the request that re-armed the roster's
child watch, sent after the change, as its listing (``listed``): for inline
payloads nothing is left to read after a change. A listing of an earlier
session is never used.
"""

from __future__ import annotations

import base64
import logging
import threading
import time
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError, NoNodeError

from consensus_api.errors import ConsensusError, MemberExistsError, NotAMemberError, OperationTimeoutError
from consensus_backends.zookeeper import payload
from consensus_backends.zookeeper.layout import Layout, decode_name, encode_name
from consensus_backends.zookeeper.lease import Connection
from consensus_backends.zookeeper.txn import Txn, check, check_deadline, create, delete, ensure

log = logging.getLogger("consensus_api.zookeeper")

#: Payloads up to this many bytes travel in the roster entry's name (base64url, no padding).
ROSTER_INLINE = 64
_ROSTER_SEPARATOR = "~"  # neither base64url nor ``_HELD`` holds it: the last one splits a name
_HELD = "*"


def roster_name(member_id: str, data: bytes) -> str:
    """The roster entry of ``member_id`` with payload ``data``."""
    inline = base64.urlsafe_b64encode(data).rstrip(b"=").decode() if len(data) <= ROSTER_INLINE else _HELD
    return f"{encode_name(member_id)}{_ROSTER_SEPARATOR}{inline}"


def parse_roster_name(name: str) -> tuple[str, bytes | None] | None:
    """``(encoded member id, payload or None where the claim holds it)``; None for a foreign name."""
    encoded, separator, inline = name.rpartition(_ROSTER_SEPARATOR)
    if not separator or not encoded:
        return None
    if inline == _HELD:
        return encoded, None
    try:
        return encoded, base64.urlsafe_b64decode(inline + "=" * (-len(inline) % 4))
    except ValueError:
        return None


class Groups:
    """The membership operations of one backend."""

    def __init__(self, connection: Connection, layout: Layout, timeout: float) -> None:
        self._connection = connection
        self._layout = layout
        self._timeout = timeout
        self._lock = threading.Lock()
        self._own: dict[tuple[str, str], str] = {}  # (group, member id) -> its roster entry
        #: Per watched group, the latest re-arm's ``getChildren2`` (a kazoo async result) not
        #: used yet, and the session losses when it was sent.
        self._rearms: dict[str, tuple[Any, int]] = {}
        #: Per watched group, the roster's newest ``pzxid`` a membership read returned: an older
        #: listing (a re-arm sent before that read) is never returned.
        self._newest: dict[str, int] = {}

    def listed(self, group: str, rearm: Any) -> None:
        """On kazoo's thread, as the watch of ``group`` fires and before the change is reported:
        the pending ``getChildren2`` that re-armed it (replaces an unused older one)."""
        losses = self._connection.losses
        with self._lock:
            self._rearms[group] = (rearm, losses)

    def watch(self, group: str) -> None:
        """``group`` is watched from now on: its reads keep its roster's newest ``pzxid``."""
        with self._lock:
            self._newest.setdefault(group, 0)

    def forget(self, group: str) -> None:
        """``group`` is no longer watched: drop its unused re-arm."""
        with self._lock:
            self._rearms.pop(group, None)
            self._newest.pop(group, None)

    def join(self, group: str, member_id: str, data: bytes) -> None:
        """Add an ephemeral member; ``MemberExistsError`` if a live one has that id."""
        deadline = time.monotonic() + self._timeout
        encoded = payload.encode(data)
        path = self._layout.member(group, member_id)
        entry = roster_name(member_id, data)
        chunks: list[str] = []
        while True:
            check_deadline(deadline, "join")
            stored = encoded.data
            if encoded.chunks and not chunks:
                self._ensure(group, deadline)
                prefix = f"{self._layout.member_chunks(group)}/{encode_name(member_id)}-"
                chunks = payload.create_chunks(
                    self._connection, prefix, encoded.chunks, deadline, ephemeral=True
                )
            txn = Txn()
            for name in chunks:
                txn.add("chunk", check(f"{self._layout.member_chunks(group)}/{name}", 0))
            if chunks:
                stored = payload.publish(chunks)
            txn.add("member", create(path, stored, ephemeral=True))
            txn.add("roster", create(f"{self._layout.roster(group)}/{entry}", ephemeral=True))
            try:
                _, role, error = txn.commit(self._connection, deadline)
            except OperationTimeoutError:
                if not self._holds(path, deadline):
                    raise
                error = None
            if error is None:
                with self._lock:
                    self._own[(group, member_id)] = entry
                return
            if role == "member" and isinstance(error, NodeExistsError):
                self._drop_chunks(group, chunks, deadline)
                self._connection.refuse_if_ghost(path, deadline)
                raise MemberExistsError(f"a live member of {group!r} already has the id {member_id!r}")
            if not isinstance(error, NoNodeError):
                raise ConsensusError(f"join failed in ZooKeeper: {type(error).__name__}")
            self._ensure(group, deadline)

    def leave(self, group: str, member_id: str) -> None:
        """Remove this backend's member; ``NotAMemberError`` if it never joined it.

        A member already gone with a lost session (its id perhaps taken by
        another session since) counts as left.
        """
        deadline = time.monotonic() + self._timeout
        with self._lock:
            entry = self._own.get((group, member_id))
        if entry is None:
            raise NotAMemberError(f"this session has no member {member_id!r} in group {group!r}")
        path = self._layout.member(group, member_id)
        [found] = self._connection.read(lambda client: [client.get_async(path)], deadline, barrier=None)
        if not isinstance(found, NoNodeError) and self._connection.owns(found[1]):
            data, stat = found
            txn = Txn()
            txn.add("member", delete(path, stat.version))
            txn.add("roster", delete(f"{self._layout.roster(group)}/{entry}"))
            for name in payload.chunk_names(data):
                txn.add("chunk", delete(f"{self._layout.member_chunks(group)}/{name}"))
            _, _, error = txn.commit(self._connection, deadline)
            if error is not None and not isinstance(error, NoNodeError):
                raise ConsensusError(f"leave failed in ZooKeeper: {type(error).__name__}")
        with self._lock:
            self._own.pop((group, member_id), None)

    def membership(self, group: str, *, linearizable: bool = True) -> dict[str, bytes]:
        """The live members of ``group`` and their data, read linearizably (else in this session's order)."""
        deadline = time.monotonic() + self._timeout
        with self._lock:
            rearm = self._rearms.pop(group, None)
        first = None if rearm is None or linearizable else self._rearmed(*rearm, deadline)
        roster = self._layout.roster(group)
        while True:
            check_deadline(deadline, "reading the membership")
            if first is not None:
                listed, losses = first
                first = None
            else:
                losses = self._connection.losses
                [listed] = self._connection.read(
                    lambda client: [client.get_children_async(roster, include_data=True)],
                    deadline,
                    barrier=self._layout.barrier_path if linearizable else None,
                )
            if isinstance(listed, NoNodeError):
                return {}
            names, parent = listed
            if not self._newer(group, parent.pzxid):
                continue  # a re-arm's listing older than a membership already returned: list again
            entries = [entry for name in names if (entry := parse_roster_name(name)) is not None]
            result = {decode_name(encoded): data for encoded, data in entries if data is not None}
            held = [encoded for encoded, data in entries if data is None]
            if not held:
                return result
            members = self._layout.members(group)

            def contents(client: KazooClient, held: list[str] = held, members: str = members) -> list[Any]:
                found = [client.get_async(f"{members}/{encoded}") for encoded in held]
                return [*found, client.exists_async(roster)]

            *found, again = self._connection.read(contents, deadline, barrier=None)
            if losses != self._connection.losses:
                continue  # the listing was of an earlier session
            if again is None or again.pzxid != parent.pzxid:
                continue  # a member joined or left meanwhile: read a consistent snapshot again
            payloads = self._decode(group, held, found, deadline)
            if payloads is not None:
                return {**result, **payloads}

    def _newer(self, group: str, pzxid: int) -> bool:
        """Whether a listing with this ``pzxid`` is no older than what was returned (and note it)."""
        with self._lock:
            newest = self._newest.get(group)
            if newest is None:
                return True  # not watched: every read is a fresh listing
            if pzxid < newest:
                return False
            self._newest[group] = pzxid
            return True

    def _rearmed(self, rearm: Any, losses: int, deadline: float) -> tuple[Any, int] | None:
        """The re-arm's ``(children, parent stat)`` and ``losses`` if it answered by ``deadline``
        in this session; else None (the caller lists the children itself)."""
        try:
            listed = rearm.get(timeout=max(0.0, deadline - time.monotonic()))
        except Exception:  # any failure: the caller reads for itself
            return None
        return (listed, losses) if losses == self._connection.losses else None

    def _decode(
        self, group: str, names: list[str], found: list[Any], deadline: float
    ) -> dict[str, bytes] | None:
        """The members' data by id; None if one vanished meanwhile (read again)."""
        result: dict[str, bytes] = {}
        for name, outcome in zip(names, found, strict=True):
            if isinstance(outcome, NoNodeError):
                return None
            value = payload.decode(self._connection, self._layout.member_chunks(group), outcome[0], deadline)
            if value is None:
                return None
            result[decode_name(name)] = value
        return result

    def _holds(self, path: str, deadline: float) -> bool:
        """After a write of unknown effect: whether this session's member znode exists (read once
        the connection is back, if time is left)."""
        try:
            [stat] = self._connection.read(lambda client: [client.exists_async(path)], deadline, barrier=None)
        except OperationTimeoutError:
            return False
        return self._connection.owns(stat)

    def _ensure(self, group: str, deadline: float) -> None:
        layout = self._layout
        paths = [
            layout.group(group),
            layout.members(group),
            layout.roster(group),
            layout.member_chunks(group),
        ]
        ensure(self._connection, paths, deadline)

    def _drop_chunks(self, group: str, chunks: list[str], deadline: float) -> None:
        """Best effort: delete chunks a failed join wrote (they would go with the session anyway)."""
        if not chunks:
            return
        parent = self._layout.member_chunks(group)
        try:
            self._connection.run(
                lambda client: [client.delete_async(f"{parent}/{n}") for n in chunks],
                deadline,
                idempotent=True,
            )
        except ConsensusError as exc:
            log.debug("dropping unused chunks below %s failed: %s", parent, exc)
