"""The etcd v3 backend: ``etcd://[user:password@]h1:2379,h2:2379/prefix``.

Guarantees, on top of the SPI's (``consensus_api.backend``):

* Reads are linearizable and every conditional write is one transaction whose
  compares decide it, fenced writes included (``consensus_backends.etcd.storage``).
* Members and candidates are keys bound to the session's lease
  (``consensus_backends.etcd.membership``, ``.election``, ``.lease``); the
  oldest candidate (lowest ``create_revision``) leads and that revision is its term.
* Changes reach the core through one resumable prefix watch
  (``consensus_backends.etcd.changes``).

Options: ``tls`` (on by itself when a ``tls_*`` file is given), ``tls_ca``,
``tls_cert``, ``tls_key`` (PEM file paths). A user and password in the URL are
used for etcd authentication; the password is never logged or shown.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import ClassVar

from consensus_api.backend import AsyncStorage, Backend, BackendEvents, Reader, Target
from consensus_api.config import BackendURL, OptionParser, Options, boolean
from consensus_api.errors import (
    BackendUnavailableError,
    ConfigurationError,
    ConsensusError,
    OperationTimeoutError,
)
from consensus_api.model import Leadership, SessionState, Versioned
from consensus_backends.etcd import aio
from consensus_backends.etcd.changes import PrefixWatch
from consensus_backends.etcd.channel import TLS
from consensus_backends.etcd.client import EtcdClient
from consensus_backends.etcd.election import Election
from consensus_backends.etcd.layout import Layout
from consensus_backends.etcd.lease import LeasedKeys, LeaseKeeper
from consensus_backends.etcd.membership import Membership
from consensus_backends.etcd.rereads import ChangeReader
from consensus_backends.etcd.seal import Seal, identity
from consensus_backends.etcd.storage import Storage

DEFAULT_PORT = 2379


class EtcdBackend(Backend):
    """One session against an etcd v3 cluster: a lease, a prefix watch and transactions."""

    #: ``tls`` enables the common security options (<https://consensus-api.github.io/consensus-api/spec/#2-connecting>).
    options: ClassVar[Mapping[str, OptionParser]] = {"tls": boolean}

    _client: EtcdClient
    _keeper: LeaseKeeper
    _storage: Storage
    _leased: LeasedKeys
    _membership: Membership
    _election: Election
    _watch: PrefixWatch
    _seal: Seal

    def __init__(self, url: BackendURL, options: Options, events: BackendEvents) -> None:
        super().__init__(url, options, events)
        if not url.endpoints:
            raise ConfigurationError("an etcd:// URL needs at least one host, e.g. etcd://127.0.0.1:2379/app")
        self._layout = Layout.from_path(url.path)
        self._lock = threading.Lock()
        self._closed = False

    @property
    def name(self) -> str:
        """``etcd``."""
        return "etcd"

    def open(self) -> None:
        """Authenticate, read the current revision, start the watch and grant the session's lease.
        The URL's endpoints are tried in a random order, so sessions spread over a cluster's members."""
        endpoints = [(e.host, e.port or DEFAULT_PORT) for e in self.url.endpoints]
        random.shuffle(endpoints)
        self._client = EtcdClient(
            endpoints,
            tls=self._tls(),
            user=self.settings.security.username,
            password=self.settings.security.password,
            request_timeout=self.settings.request_timeout,
        )
        self._seal = Seal(self._client, self._layout, self.settings.request_timeout)
        self._keeper = LeaseKeeper(
            self._client,
            self.settings.session_timeout,
            self.settings.request_timeout,
            self._on_state,
            self._seal.announce,
        )
        self._storage = Storage(self._client, self._layout, self.settings.request_timeout)
        self._leased = LeasedKeys(self._client, self._keeper, self.settings.request_timeout)
        self._membership = Membership(self._client, self._layout, self._leased, self.settings.request_timeout)
        self._election = Election(self._client, self._layout, self._leased, self.settings.request_timeout)
        deadline = time.monotonic() + self.settings.connect_timeout
        try:
            self._client.authenticate(deadline)
            revision = self._client.revision(self._layout.everything, deadline)
            self._watch = PrefixWatch(
                self._client,
                self._layout,
                revision=revision,
                request_timeout=self.settings.request_timeout,
                changed=self.events.changed,
                on_trouble=self._keeper.check_now,
                on_deleted=self._leased.deleted,
            )
            try:
                self._keeper.start(deadline)
            except BaseException:
                self._watch.stop(time.monotonic())
                raise
        except OperationTimeoutError:
            self._client.close()
            raise BackendUnavailableError(
                f"could not reach etcd at {self.url.host_list(DEFAULT_PORT)} "
                f"within connect_timeout={self.settings.connect_timeout}s"
            ) from None
        except BaseException:
            self._client.close()
            raise

    def close(self) -> None:
        """Revoke the lease (members and candidates vanish at once), end the watch, disconnect."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        deadline = self._deadline()
        self._watch.stop(deadline)
        self._keeper.stop(deadline)
        self._client.close()

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

    # Watches

    def watch(self, target: Target) -> None:
        """Report changes of ``target`` (no I/O: the prefix watch already covers it)."""
        self._watch.add(target)

    def unwatch(self, target: Target) -> None:
        """Stop reporting changes of ``target``."""
        self._watch.discard(target)

    def change_reader(self) -> Reader:
        """A value's re-read from its latest watch event where that is provably current (``rereads``)."""
        return ChangeReader(self._storage, self._membership, self._election, self._client, self._watch)

    def async_storage(self) -> AsyncStorage:
        """The storage over ``grpc.aio`` on the running event loop (``aio.AsyncStorage``): the same
        requests, connection, token and trouble as the blocking calls."""
        return aio.AsyncStorage(self._client, self._storage.steps, self.settings.request_timeout)

    def server_version(self) -> str | None:
        """The version the etcd member reports in its status (None if it does not answer in time)."""
        try:
            return self._client.status_version(self._deadline())
        except ConsensusError:
            return None

    # Migration

    def term_ceiling(self) -> int:
        """See ``Seal.term_ceiling``: the cluster's revision."""
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
        """The session's lease id in hex; ``SessionLostError`` while a lost lease is being replaced."""
        return identity(self._keeper.current())

    def live_sessions(self) -> frozenset[str]:
        """See ``Seal.live_sessions``."""
        return self._seal.live_sessions()

    def fault_identity(self) -> dict[str, object]:
        """The session's lease: ``{"lease": id}`` (None while it is being replaced), the member its
        calls go to (``endpoint``, ``host:port``) and this process (``pid``), and with TLS the file
        options ``tls_ca``, ``tls_cert``, ``tls_key`` (paths) to reach it (tests only)."""
        identity: dict[str, object] = {
            "lease": self._keeper.held(),
            "endpoint": self._client.endpoint(),
            "pid": os.getpid(),
        }
        security = self.settings.security
        if security.tls:
            identity["tls"] = {name: getattr(security, name) for name in ("tls_ca", "tls_cert", "tls_key")}
        return identity

    # Helpers

    def _deadline(self) -> float:
        return time.monotonic() + self.settings.request_timeout

    def _on_state(self, state: SessionState) -> None:
        """From the lease thread: cut calls short while in trouble, forget what a lost lease held,
        and replace the watch stream (it may be dead without knowing it) once connected again.

        A lease lost without connection trouble (it expired while this process was paused, or
        etcd revoked it) cuts nothing short: calls in flight reach a working server and get
        definite answers (a stale leader's fenced write ``FencedError``, not an unknown outcome)."""
        troubled = state is SessionState.SUSPENDED or (
            state is SessionState.LOST and self._keeper.lost_in_trouble
        )
        self._client.set_troubled(troubled)
        if state is SessionState.LOST:
            self._leased.forget()
        elif state is SessionState.CONNECTED:
            self._watch.restart()
        self.events.state_changed(state)

    def _tls(self) -> TLS | None:
        """The TLS settings as PEM contents; ``ConfigurationError`` for unreadable or encrypted ones."""
        security = self.settings.security
        if not security.tls:
            return None
        if security.tls_key_password is not None:
            raise ConfigurationError("etcd (grpc) cannot use an encrypted tls_key: give it unencrypted")
        contents: dict[str, bytes] = {}
        for name in ("tls_ca", "tls_cert", "tls_key"):
            path: str | None = getattr(security, name)
            if path is None:
                continue
            try:
                contents[name] = Path(path).read_bytes()
            except OSError as exc:
                raise ConfigurationError(f"cannot read the {name} file {path!r}: {exc.strerror}") from None
        return TLS(contents.get("tls_ca"), contents.get("tls_cert"), contents.get("tls_key"))
