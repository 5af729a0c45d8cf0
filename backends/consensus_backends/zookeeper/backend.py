"""``ZooKeeperBackend``: the backend SPI over kazoo (``zookeeper://h1:2181,h2:2181/chroot``).

Options besides the common ones: ``tls`` (bool), ``tls_ca``, ``tls_cert``,
``tls_key`` (file paths). ``user:password@`` in the URL selects digest
authentication with ACLs that admit only that identity. Every call is bounded
by ``request_timeout``; see the modules of this package for the guarantees of
each part.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator, Mapping
from typing import ClassVar

from kazoo.exceptions import KazooException

from consensus_api.backend import AsyncStorage, Backend, BackendEvents, Target
from consensus_api.config import BackendURL, OptionParser, Options
from consensus_api.errors import (
    BackendUnavailableError,
    ConsensusError,
    OperationTimeoutError,
    SessionLostError,
)
from consensus_api.model import Leadership, Versioned
from consensus_backends.zookeeper import aio
from consensus_backends.zookeeper.changes import Watches
from consensus_backends.zookeeper.election import Elections
from consensus_backends.zookeeper.layout import Layout, chroot_of
from consensus_backends.zookeeper.lease import Connection
from consensus_backends.zookeeper.membership import Groups
from consensus_backends.zookeeper.rereads import ChangeReader
from consensus_backends.zookeeper.seal import Presence, Seal
from consensus_backends.zookeeper.security import OPTIONS, Security
from consensus_backends.zookeeper.storage import Storage
from consensus_backends.zookeeper.txn import ensure
from consensus_backends.zookeeper.walk import walk


class ZooKeeperBackend(Backend):
    """One ZooKeeper session (kazoo client) serving one consensus-api ``Session``."""

    options: ClassVar[Mapping[str, OptionParser]] = OPTIONS

    def __init__(self, url: BackendURL, options: Options, events: BackendEvents) -> None:
        super().__init__(url, options, events)
        self._layout = Layout(chroot_of(url.path))
        self._connection = Connection(
            url, options, Security(options.security), events.state_changed, self._on_connected
        )
        timeout = options.request_timeout
        self._elections = Elections(self._connection, self._layout, timeout)
        self._groups = Groups(self._connection, self._layout, timeout)
        self._watches = Watches(self._connection.client, self._layout, events.changed, self._groups)
        self._seal = Seal(self._connection, self._layout, timeout)
        self._presence = Presence(self._connection, self._layout, timeout)
        self._storage = Storage(self._connection, self._layout, self._elections, self._seal, timeout)
        self._change_reader = ChangeReader(self._storage, self._groups, self._elections)

    @property
    def name(self) -> str:
        """Always ``zookeeper``."""
        return "zookeeper"

    def __repr__(self) -> str:
        return f"<ZooKeeperBackend {self.url.redacted()}>"

    def open(self) -> None:
        """Connect, then create the chroot's base znodes, check that the credentials may use them, read
        the seal and create the session's znode (``seal``), all within ``connect_timeout``: a server
        that answers the handshake, then nothing, is ``BackendUnavailableError`` like one that never
        answers; kazoo's threads and sockets are gone when it is raised. A session lost before this
        returns (an ensemble restarted before it committed the new session) is replaced: the set-up
        is retried on the next session."""
        timeout = self.settings.connect_timeout
        deadline = time.monotonic() + timeout
        self._connection.open(deadline)
        while True:
            try:
                ensure(self._connection, self._layout.base_paths(), deadline)
                _, seal, announced = self._connection.read(
                    lambda client: [
                        client.get_children_async(self._layout.kv),
                        client.get_async(self._layout.seal),
                        self._presence.announce(client),
                    ],
                    deadline,
                    barrier=self._layout.barrier_path,
                )
                self._seal.primed(seal)
                self._presence.created(announced)
                return
            except SessionLostError as exc:
                if time.monotonic() < deadline:
                    time.sleep(0.05)  # kazoo opens the next session
                    continue
                failure: ConsensusError = exc
            except OperationTimeoutError as exc:
                failure = exc
            except ConsensusError:
                self._connection.close()
                raise
            self._connection.abort()
            raise BackendUnavailableError(
                f"ZooKeeper at {self.url.redacted()} accepted the connection but did not answer "
                f"within connect_timeout ({timeout:g} s): {failure}"
            ) from None

    def close(self) -> None:
        """Close the ZooKeeper session: its members and candidates are gone when this returns."""
        self._connection.close()

    def _on_connected(self) -> None:
        self._watches.rearm_all()
        self._presence.connected()

    # Storage

    def fetch(self, key: str) -> Versioned | None:
        """See ``Storage.fetch``."""
        return self._storage.fetch(key)

    def put(self, key: str, value: bytes, fence: Leadership | None) -> int:
        """See ``Storage.put``."""
        return self._storage.put(key, value, fence)

    def update(self, key: str, value: bytes, version: int | None, fence: Leadership | None) -> int:
        """See ``Storage.update``."""
        return self._storage.update(key, value, version, fence)

    def delete(self, key: str, version: int | None, fence: Leadership | None) -> None:
        """See ``Storage.delete``."""
        self._storage.delete(key, version, fence)

    def keys(self, namespace: str) -> frozenset[str]:
        """See ``Storage.keys``."""
        return self._storage.keys(namespace)

    def async_storage(self) -> AsyncStorage:
        """The storage over kazoo's asynchronous requests, completed on the running event loop
        (``aio.AsyncStorage``): the same session, znodes and checks as the blocking calls."""
        return aio.AsyncStorage(self._connection, self._storage.steps, self.settings.request_timeout)

    def walk(self, namespace: str) -> Iterator[tuple[str, Versioned]]:
        """See ``consensus_backends.zookeeper.walk``."""
        return walk(self._connection, self._layout, namespace, self.settings.request_timeout)

    # Group membership

    def join(self, group: str, member_id: str, data: bytes) -> None:
        """See ``Groups.join``."""
        self._groups.join(group, member_id, data)

    def leave(self, group: str, member_id: str) -> None:
        """See ``Groups.leave``."""
        self._groups.leave(group, member_id)

    def membership(self, group: str) -> dict[str, bytes]:
        """See ``Groups.membership``."""
        return self._groups.membership(group)

    # Leader election

    def nominate(self, service: str, candidate_id: str) -> bool:
        """See ``Elections.nominate``."""
        return self._elections.nominate(service, candidate_id)

    def resign(self, service: str, candidate_id: str) -> None:
        """See ``Elections.resign``."""
        self._elections.resign(service, candidate_id)

    def leadership(self, service: str) -> Leadership | None:
        """See ``Elections.leadership``."""
        return self._elections.leadership(service)

    # Watches

    def watch(self, target: Target) -> None:
        """See ``Watches.watch``."""
        self._watches.watch(target)

    def unwatch(self, target: Target) -> None:
        """See ``Watches.unwatch``."""
        self._watches.unwatch(target)

    def change_reader(self) -> ChangeReader:
        """Re-reads after a watch fired skip the linearizing no-op write (``rereads``)."""
        return self._change_reader

    def server_version(self) -> str | None:
        """From the ``srvr`` four-letter command (None where the server does not allow it); kazoo
        sends it on a connection of its own, bounded by the session timeout."""
        try:
            answer = self._connection.client.command(b"srvr")
        except (KazooException, OSError):
            return None
        match = re.search(r"Zookeeper version: ([^-,\s]+)", answer)
        return None if match is None else match[1]

    # Migration

    def term_ceiling(self) -> int:
        """See ``Seal.term_ceiling``: the zxid of a write made now."""
        return self._seal.term_ceiling()

    def seal(self) -> None:
        """See ``Seal.seal``."""
        self._seal.seal()

    def unseal(self) -> None:
        """See ``Seal.unseal``."""
        self._seal.unseal()

    def sealed(self) -> bool:
        """See ``Seal.sealed``."""
        return self._seal.sealed()

    def session_identity(self) -> str:
        """The ZooKeeper session id in hex (``Presence.identity``)."""
        return self._presence.identity()

    def live_sessions(self) -> frozenset[str]:
        """The sessions with a znode under ``migration/sessions`` (``Presence.live``)."""
        return self._presence.live()

    def fault_identity(self) -> dict[str, object]:
        """The ZooKeeper session: ``{"session_id": int, "password": hex}``, and with TLS the file
        options ``tls_ca``, ``tls_cert``, ``tls_key`` (paths) to reach it (tests only)."""
        client_id = self._connection.client.client_id
        if not client_id:
            return {}
        identity: dict[str, object] = {"session_id": int(client_id[0]), "password": bytes(client_id[1]).hex()}
        security = self.settings.security
        if security.tls:
            identity["tls"] = {
                "tls_ca": security.tls_ca,
                "tls_cert": security.tls_cert,
                "tls_key": security.tls_key,
            }
        return identity
