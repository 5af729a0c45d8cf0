"""The Redis backend: ``redis://[user:password@]host:6379/prefix`` (a standalone Redis >= 7.0).

Options: ``tls`` (on by itself when a ``tls_*`` file is given), ``tls_ca``,
``tls_cert``, ``tls_key``, ``tls_key_password``: the server's chain and host
name are checked. A user and password go to Redis's ``AUTH`` (an ACL user);
the password is never logged or shown.

Guarantees, on top of the SPI's (``consensus_api.backend``):

* Every write is one Lua script (``consensus_redis.storage``; the scripts are
  ``consensus_redis.scripts``), atomic on the server: its conditions (existence,
  version, and for a fenced write the election's term and leader) are checked in
  the same script that writes.
* Versions come from one counter (``INCR``), so they strictly increase across
  updates, deletes and re-creates; reads go to the one server, so they are
  linearizable.
* Members and candidates (``consensus_redis.membership``, ``.election``) belong
  to the session key (``consensus_redis.lease``), which Redis expires by its own
  clock; a dead session's entries are reaped by the heartbeat of any live session
  and by every read of their group or election. The earliest live candidate
  leads; each change of leader takes the next value of the service's term
  counter, so a term has at most one leader.
* Listeners read a change stream (``consensus_redis.changes``), resumable by id.
* Durability is the server's: with ``appendonly yes`` and ``appendfsync always``
  (the test launcher's configuration) an acknowledged write survives a crash of
  the server. With replicas, Sentinel or Cluster nothing here holds: replication
  is asynchronous, and a failover may lose acknowledged writes (docs/redis.md).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from typing import ClassVar

from consensus_api.backend import AsyncStorage, Backend, BackendEvents, Target
from consensus_api.config import BackendURL, OptionParser, Options, boolean
from consensus_api.errors import (
    BackendUnavailableError,
    ConfigurationError,
    ConsensusError,
    OperationTimeoutError,
)
from consensus_api.model import Leadership, SessionState, Versioned
from consensus_redis.aio import RedisStorage
from consensus_redis.changes import ChangeStream
from consensus_redis.client import RedisClient
from consensus_redis.election import Election
from consensus_redis.layout import Layout
from consensus_redis.lease import Lease
from consensus_redis.membership import Membership
from consensus_redis.seal import Seal
from consensus_redis.storage import Storage


class RedisBackend(Backend):
    """One session against a Redis server: a session key, Lua scripts and a change stream."""

    #: ``tls`` enables the common security options (<https://consensus-api.github.io/consensus-api/spec/#2-connecting>).
    options: ClassVar[Mapping[str, OptionParser]] = {"tls": boolean}

    def __init__(self, url: BackendURL, options: Options, events: BackendEvents) -> None:
        super().__init__(url, options, events)
        if len(url.endpoints) > 1:
            raise ConfigurationError("the redis backend serves one standalone server: give one host:port")
        self._layout = Layout.from_path(url.path)
        self._prefix = self._layout.prefix
        self._client = RedisClient(url, options)
        self._lease = Lease(self._client, self._prefix, options.session_timeout, self._on_state)
        self._changes = ChangeStream(self._client, self._layout, events.changed, self._lease.check_now)
        self._storage = Storage(self._client, self._layout)
        self._membership = Membership(self._client, self._layout, self._lease)
        self._election = Election(self._client, self._layout, self._lease)
        self._seal = Seal(self._client, self._layout)
        self._closed = False
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        """``redis``."""
        return "redis"

    def open(self) -> None:
        """Open the session key and start the change stream reader."""
        deadline = time.monotonic() + self.settings.connect_timeout
        try:
            self._changes.start(deadline)
            self._lease.open(deadline)
        except (OperationTimeoutError, BackendUnavailableError) as exc:
            self._changes.stop(self._client.request_timeout)
            self._client.close()
            raise BackendUnavailableError(f"cannot reach {self.url.redacted()}: {exc}") from None
        except BaseException:
            self._changes.stop(self._client.request_timeout)
            self._client.close()
            raise

    def close(self) -> None:
        """Drop the session (members and candidates vanish at once), stop reading, disconnect."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._lease.close()  # first: the others see the members go at once
        self._changes.halt()
        self._client.close()  # ends the reader's blocked XREAD too
        self._changes.stop(self._client.request_timeout)

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

    def walk(self, namespace: str) -> Iterator[tuple[str, Versioned]]:
        """See ``Storage.walk``."""
        return self._storage.walk(namespace)

    def async_storage(self) -> AsyncStorage | None:
        """The same scripts over ``redis.asyncio`` (``consensus_redis.aio``)."""
        return RedisStorage(self._client, self._layout)

    # Group membership

    def join(self, group: str, member_id: str, data: bytes) -> None:
        """See ``Membership.join``."""
        self._membership.join(group, member_id, data)

    def leave(self, group: str, member_id: str) -> None:
        """See ``Membership.leave``."""
        self._membership.leave(group, member_id)

    def membership(self, group: str) -> dict[str, bytes]:
        """See ``Membership.membership``."""
        return self._membership.membership(group)

    # Leader election

    def nominate(self, service: str, candidate_id: str) -> bool:
        """See ``Election.nominate``."""
        return self._election.nominate(service, candidate_id)

    def resign(self, service: str, candidate_id: str) -> None:
        """See ``Election.resign``."""
        self._election.resign(service, candidate_id)

    def leadership(self, service: str) -> Leadership | None:
        """See ``Election.leadership``."""
        return self._election.leadership(service)

    # Migration

    def term_ceiling(self) -> int:
        """See ``Seal.term_ceiling``."""
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
        """The id of this session's key (a new one after a loss)."""
        return self._lease.session_id

    def live_sessions(self) -> frozenset[str]:
        """See ``Seal.live_sessions``."""
        return self._seal.live_sessions()

    # Watches

    def watch(self, target: Target) -> None:
        """Report changes of ``target`` (no I/O: the change stream covers every target)."""
        self._changes.add(target)

    def unwatch(self, target: Target) -> None:
        self._changes.discard(target)

    def server_version(self) -> str | None:
        """``redis_version`` from ``INFO server`` (None if the server does not answer in time)."""
        try:
            info = self._client.command("INFO", "server")
        except ConsensusError:
            return None
        for line in bytes(info).decode(errors="replace").splitlines():
            if line.startswith("redis_version:"):
                return line.partition(":")[2].strip()
        return None

    def fault_identity(self) -> dict[str, object]:
        """The session: ``{"prefix": ..., "session_id": ...}``, and with TLS the file options ``tls_ca``,
        ``tls_cert``, ``tls_key`` (paths) to reach it (tests only)."""
        identity: dict[str, object] = {"prefix": self._prefix, "session_id": self._lease.session_id}
        security = self.settings.security
        if security.tls:
            identity["tls"] = {name: getattr(security, name) for name in ("tls_ca", "tls_cert", "tls_key")}
        return identity

    # Helpers

    def _on_state(self, state: SessionState) -> None:
        """From the heartbeat: report the state; after a loss, every watched target is re-read."""
        self.events.state_changed(state)
