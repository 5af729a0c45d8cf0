"""The Redis backend: ``redis://[user:password@]host:6379/prefix`` (a standalone Redis >= 7.0).

Options: ``tls`` (on by itself when a ``tls_*`` file is given), ``tls_ca``,
``tls_cert``, ``tls_key``, ``tls_key_password``: the server's chain and host
name are checked. A user and password go to Redis's ``AUTH`` (an ACL user);
the password is never logged or shown.

Guarantees, on top of the SPI's (``consensus_api.backend``):

* Every write is one Lua script (``consensus_redis.scripts``), atomic on the
  server: its conditions (existence, version, and for a fenced write the
  election's term and leader) are checked in the same script that writes.
* Versions come from one counter (``INCR``), so they strictly increase across
  updates, deletes and re-creates; reads go to the one server, so they are
  linearizable.
* Members and candidates belong to the session key (``consensus_redis.lease``),
  which Redis expires by its own clock; a dead session's entries are reaped
  by the heartbeat of any live session and by every read of their group or
  election. The earliest live candidate leads; each change of leader takes the
  next value of the service's term counter, so a term has at most one leader.
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
from typing import Any, ClassVar

from consensus_api.backend import Backend, BackendEvents, Target
from consensus_api.config import BackendURL, OptionParser, Options, boolean
from consensus_api.errors import (
    BackendUnavailableError,
    ConfigurationError,
    ConsensusError,
    FencedError,
    KeyExistsError,
    KeyNotFoundError,
    MemberExistsError,
    NotAMemberError,
    OperationTimeoutError,
    SessionLostError,
    VersionConflictError,
)
from consensus_api.keys import SEPARATOR
from consensus_api.model import Leadership, SessionState, Versioned
from consensus_redis import scripts
from consensus_redis.changes import ChangeStream
from consensus_redis.client import RedisClient, Script
from consensus_redis.layout import Layout
from consensus_redis.lease import Lease

#: Keys (with values) per page of ``walk``.
WALK_PAGE = 256

PUT, UPDATE, DELETE = Script(scripts.PUT), Script(scripts.UPDATE), Script(scripts.DELETE)
WALK = Script(scripts.WALK_PAGE)
JOIN, LEAVE, MEMBERSHIP = Script(scripts.JOIN), Script(scripts.LEAVE), Script(scripts.MEMBERSHIP)
NOMINATE, RESIGN, LEADERSHIP = Script(scripts.NOMINATE), Script(scripts.RESIGN), Script(scripts.LEADERSHIP)


class RedisBackend(Backend):
    """One session against a Redis server: a session key, Lua scripts and a change stream."""

    #: ``tls`` enables the common security options (docs/spec.md section 2).
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
        """The value and version of ``key`` (``HMGET`` on the one server: linearizable)."""
        value, version = self._client.command("HMGET", self._layout.key("kv", key), "v", "n")
        return None if version is None else Versioned(bytes(value), int(version))

    def put(self, key: str, value: bytes, fence: Leadership | None) -> int:
        reply = self._write(PUT, fence, key, value)
        if reply[0] == "exists":
            raise KeyExistsError(f"key {key!r} already exists")
        return int(reply[1])

    def update(self, key: str, value: bytes, version: int | None, fence: Leadership | None) -> int:
        reply = self._write(UPDATE, fence, key, value, "" if version is None else version)
        self._raise_condition(reply, key, version)
        return int(reply[1])

    def delete(self, key: str, version: int | None, fence: Leadership | None) -> None:
        reply = self._write(DELETE, fence, key, "" if version is None else version)
        self._raise_condition(reply, key, version)

    def keys(self, namespace: str) -> frozenset[str]:
        """The set of existing keys directly below ``namespace`` (kept by the write scripts)."""
        members = self._client.command("SMEMBERS", self._layout.key("ns", namespace))
        return frozenset(member.decode() for member in members)

    def walk(self, namespace: str) -> Iterator[tuple[str, Versioned]]:
        """Pages of ``WALK_PAGE`` keys in key order, each read by one script (a linearizable read)."""
        prefix = namespace + SEPARATOR if namespace else ""
        after = ""
        while True:
            reply = self._client.run(WALK, self._prefix, prefix, after, WALK_PAGE, write=False)
            rows = reply[2]
            for i in range(0, len(rows), 3):
                yield rows[i].decode(), Versioned(bytes(rows[i + 1]), int(rows[i + 2]))
            if int(reply[1]) < WALK_PAGE or not rows:
                return
            after = rows[-3].decode()

    # Group membership

    def join(self, group: str, member_id: str, data: bytes) -> None:
        reply = self._session_call(JOIN, group, member_id, data)
        if reply[0] == "exists":
            raise MemberExistsError(f"group {group!r} already has a live member {member_id!r}")

    def leave(self, group: str, member_id: str) -> None:
        reply = self._session_call(LEAVE, group, member_id)
        if reply[0] == "other":
            raise NotAMemberError(f"member {member_id!r} of group {group!r} is held by another session")

    def membership(self, group: str) -> dict[str, bytes]:
        reply = self._client.run(MEMBERSHIP, self._prefix, group)
        pairs = reply[1]
        return {pairs[i].decode(): bytes(pairs[i + 1]) for i in range(0, len(pairs), 2)}

    # Leader election

    def nominate(self, service: str, candidate_id: str) -> bool:
        reply = self._session_call(NOMINATE, service, candidate_id)
        if reply[0] == "exists":
            raise MemberExistsError(f"service {service!r} already has a live candidate {candidate_id!r}")
        return bool(reply[1])

    def resign(self, service: str, candidate_id: str) -> None:
        reply = self._session_call(RESIGN, service, candidate_id)
        if reply[0] == "other":
            raise NotAMemberError(f"candidate {candidate_id!r} for {service!r} is held by another session")

    def leadership(self, service: str) -> Leadership | None:
        reply = self._client.run(LEADERSHIP, self._prefix, service)
        if reply[0] == "missing":
            return None
        return Leadership(service, reply[1].decode(), int(reply[2]))

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

    def _write(self, script: Script, fence: Leadership | None, *args: Any) -> list[Any]:
        """Run a storage script; ``FencedError`` if ``fence`` is not the current leadership."""
        fencing: tuple[str, str, str | int] = ("", "", "")
        if fence is not None:
            if fence.term < 1:
                raise FencedError(f"term {fence.term} of {fence.service!r} was never current")
            fencing = (fence.service, fence.leader_id, fence.term)
        reply = self._client.run(script, self._prefix, *fencing, *args)
        if reply[0] == "fenced" and fence is not None:
            raise FencedError(f"{fence.leader_id!r} no longer leads {fence.service!r} in term {fence.term}")
        return reply

    @staticmethod
    def _raise_condition(reply: list[Any], key: str, version: int | None) -> None:
        if reply[0] == "missing":
            raise KeyNotFoundError(f"key {key!r} does not exist")
        if reply[0] == "conflict":
            raise VersionConflictError(f"key {key!r} is at version {int(reply[1])}, not {version}")

    def _session_call(self, script: Script, *args: str | bytes) -> list[Any]:
        """Run a membership or election script as this session; ``SessionLostError`` if it is gone."""
        reply = self._client.run(script, self._prefix, self._lease.session_id, *args)
        if reply[0] == "lost":
            self._lease.check_now()
            raise SessionLostError("this session has expired on the server; it is being re-established")
        return reply

    def _on_state(self, state: SessionState) -> None:
        """From the heartbeat: report the state; after a loss, every watched target is re-read."""
        self.events.state_changed(state)
