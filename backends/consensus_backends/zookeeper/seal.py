"""A migration's seal of the store, the terms it has issued, and its live sessions.

Where they live: ``layout`` (``migration/seal``, ``migration/sessions``).

Guarantees:

* The seal: every storage write is already one multi-operation (``txn``);
  ``Seal.guarding`` adds one more operation to it, a check of the seal znode's
  ``stat.version`` at the version last seen unsealed. ``seal`` changes that
  znode (a write, so its version grows), at a zxid S. A write's multi commits
  at one zxid W, all or nothing: if W < S it was applied before the seal; if
  W > S its check meets a newer version and nothing of it is applied. After a
  failed check the writer reads the seal znode linearizably: sealed, it raises
  ``SealedError``; unsealed (``unseal`` also changes the version), it retries
  with the new version. The znode is never deleted, so a version is never seen
  twice. Steady state costs one check operation inside a multi the write sends
  anyway: no request more.
* ``term_ceiling``: terms are the czxids of candidate znodes (``election``).
  It writes the ``migration`` znode and returns that write's zxid: it commits
  after every term issued before the call, so it is greater than all of them,
  and later calls return more (zxids grow with every write of the ensemble).
* Sessions: each backend session creates one ephemeral znode named by its
  session id, on ``open`` and on the first CONNECTED of every later session.
  The server deletes it when the session ends (closed or expired), so the
  children of ``migration/sessions`` are the live sessions on this root; a
  closed session's is gone when ``close`` returns.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from consensus_api.errors import ConsensusError, SealedError, SessionLostError
from consensus_backends.zookeeper import steps
from consensus_backends.zookeeper.client import TRANSIENT
from consensus_backends.zookeeper.layout import Layout
from consensus_backends.zookeeper.lease import Connection
from consensus_backends.zookeeper.steps import Steps
from consensus_backends.zookeeper.txn import Op, check, check_deadline, ensure, ensuring

log = logging.getLogger("consensus_api.zookeeper")

#: The seal znode's data while sealed (anything else but b"" counts as sealed too).
SEALED = b"sealed"


class Seal:
    """The seal of one root, and the check each write of this backend carries."""

    def __init__(self, connection: Connection, layout: Layout, timeout: float) -> None:
        self._connection = connection
        self._layout = layout
        self._timeout = timeout
        self._lock = threading.Lock()
        #: The seal znode's version and whether it was sealed there, as last read (None: unknown).
        self._seen: tuple[int, bool] | None = None

    def guarding(self, deadline: float) -> Steps[Op]:
        """The check that lets a write's multi commit only while the store is unsealed (no request
        while the unsealed version is known); ``SealedError`` if it is sealed now (a linearizable
        read found it so). As steps (``steps``), for the storage operations."""
        seen = self._seen
        if seen is None or seen[1]:
            seen = yield from self._reading(deadline)
            if seen[1]:
                raise SealedError(f"the ZooKeeper store {self._layout.root or '/'} is sealed by a migration")
        return check(self._layout.seal, seen[0])

    def primed(self, found: Any) -> None:
        """Remember the outcome of a linearizable ``get`` of the seal znode (``open`` reads it in its
        batch, so a session's first write needs no read of its own)."""
        if isinstance(found, tuple):
            data, stat = found
            self._remember(int(stat.version), data != b"")

    def refused(self) -> None:
        """A write's seal check failed: the version it checked is stale; read it again next time."""
        with self._lock:
            self._seen = None

    def seal(self) -> None:
        """Seal the root (idempotent); see the module's guarantees."""
        self._set(True)

    def unseal(self) -> None:
        """Unseal the root (idempotent)."""
        self._set(False)

    def sealed(self) -> bool:
        """Whether the root is sealed now (a linearizable read)."""
        return self._read(time.monotonic() + self._timeout)[1]

    def term_ceiling(self) -> int:
        """The zxid of a write to the ``migration`` znode (see the module's guarantees)."""
        deadline = time.monotonic() + self._timeout
        path = self._layout.migration
        while True:
            check_deadline(deadline, "term_ceiling")
            [stat] = self._connection.run(
                lambda client: [client.set_async(path, b"")], deadline, idempotent=True
            )
            if isinstance(stat, NoNodeError):
                ensure(self._connection, [path], deadline)
                continue
            if isinstance(stat, Exception):
                raise ConsensusError(f"ZooKeeper refused a write to {path}: {type(stat).__name__}")
            return int(stat.mzxid)

    def _set(self, sealed: bool) -> None:
        deadline = time.monotonic() + self._timeout
        path, data = self._layout.seal, SEALED if sealed else b""
        while True:
            check_deadline(deadline, "seal" if sealed else "unseal")
            version, now = self._read(deadline)
            if now == sealed:
                return
            # Re-sent after a broken connection it meets its own new version: read again, and done.
            [stat] = self._connection.run(
                functools.partial(_set_data, path, data, version), deadline, idempotent=True
            )
            if isinstance(stat, BadVersionError | NoNodeError):
                continue
            if isinstance(stat, Exception):
                raise ConsensusError(f"ZooKeeper refused a write to {path}: {type(stat).__name__}")
            self._remember(int(stat.version), sealed)
            return

    def _read(self, deadline: float) -> tuple[int, bool]:
        """The seal znode's version and state, read linearizably (created where it is missing)."""
        return steps.drive(self._connection, self._reading(deadline), deadline)

    def _reading(self, deadline: float) -> Steps[tuple[int, bool]]:
        path = self._layout.seal
        while True:
            check_deadline(deadline, "reading the seal")
            [found] = yield from steps.send(
                lambda client: [client.get_async(path)], barrier=self._layout.barrier_path
            )
            if isinstance(found, NoNodeError):
                yield from ensuring([self._layout.migration, path])
                continue
            data, stat = found
            return self._remember(int(stat.version), data != b"")

    def _remember(self, version: int, sealed: bool) -> tuple[int, bool]:
        with self._lock:
            if self._seen is None or self._seen[0] <= version:
                self._seen = (version, sealed)
        return version, sealed


def _set_data(path: str, data: bytes, version: int, client: KazooClient) -> list[Any]:
    return [client.set_async(path, data, version)]


class Presence:
    """This backend's ephemeral znode under ``migration/sessions``, one per ZooKeeper session."""

    def __init__(self, connection: Connection, layout: Layout, timeout: float) -> None:
        self._connection = connection
        self._layout = layout
        self._timeout = timeout
        self._lock = threading.Lock()
        self._opening = False
        self._sending: int | None = None
        #: The session whose znode was created, as far as this client knows.
        self._announced: int | None = None

    def identity(self) -> str:
        """The current session id in hex (the name of its znode)."""
        session_id = self._connection.session_id
        if session_id is None:
            raise SessionLostError("no ZooKeeper session yet")
        return f"{session_id:x}"

    def announce(self, client: KazooClient) -> Any:
        """The request that creates the current session's znode (``open`` sends it in its batch,
        re-sent safely: a znode already there is this very session's). From now on every new
        session creates its own when it connects (``connected``)."""
        session_id = self._connection.session_id
        if session_id is None:
            raise SessionLostError("no ZooKeeper session yet")
        with self._lock:
            self._opening = True
            self._sending = session_id
        return client.create_async(self._path(session_id), ephemeral=True, makepath=True)

    def created(self, outcome: Any) -> None:
        """The outcome of ``announce``'s request (sent in the session it was built in: a call never
        spans two): ``ConsensusError`` unless the znode exists."""
        if isinstance(outcome, Exception) and not isinstance(outcome, NodeExistsError):
            raise ConsensusError(f"could not announce the session in ZooKeeper ({type(outcome).__name__})")
        with self._lock:
            self._announced = self._sending

    def connected(self) -> None:
        """On kazoo's thread at CONNECTED (never blocks): a new session sends the create of its znode.
        One that fails for a broken connection is sent again at the next CONNECTED."""
        session_id = self._connection.session_id
        with self._lock:
            if not self._opening or session_id is None or session_id == self._announced:
                return
        self._connection.client.create_async(self._path(session_id), ephemeral=True, makepath=True).rawlink(
            lambda result: self._settled(session_id, result)
        )

    def _settled(self, session_id: int, result: Any) -> None:
        error = result.exception
        if error is None or isinstance(error, NodeExistsError):
            with self._lock:
                self._announced = session_id
        elif not isinstance(error, TRANSIENT):
            log.warning("could not announce ZooKeeper session 0x%x: %s", session_id, type(error).__name__)

    def live(self) -> frozenset[str]:
        """The ids of the live sessions on this root (a linearizable read)."""
        deadline = time.monotonic() + self._timeout
        [names] = self._connection.read(
            lambda client: [client.get_children_async(self._layout.sessions)],
            deadline,
            barrier=self._layout.barrier_path,
        )
        if isinstance(names, NoNodeError):
            return frozenset()
        if isinstance(names, Exception):
            raise ConsensusError(f"could not list the sessions in ZooKeeper ({type(names).__name__})")
        return frozenset(names)

    def _path(self, session_id: int) -> str:
        return f"{self._layout.sessions}/{session_id:x}"
