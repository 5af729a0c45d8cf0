"""The etcd v3 backend: ``etcd://[user:password@]h1:2379,h2:2379/prefix``.

Guarantees, on top of the SPI's (``consensus_api.backend``):

* Reads are linearizable (etcd's default); versions are ``mod_revision``
  values, so they strictly increase across updates, deletes and re-creates.
* Every conditional write is one transaction whose compares decide it; a
  failure branch reads back what is needed to name the error exactly.
* Members and candidates are keys bound to the session's lease
  (``consensus_backends.etcd._lease``); the oldest candidate (lowest ``create_revision``)
  leads and that revision is its term; fenced writes compare the fence in
  the same transaction (``consensus_backends.etcd._requests``).
* Changes reach the core through one resumable prefix watch
  (``consensus_backends.etcd._watch``).

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
from typing import TYPE_CHECKING, Any, ClassVar

from pyetcd import etcdrpc

from consensus_api.backend import Backend, BackendEvents, Reader, Target
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
from consensus_api.keys import join_key
from consensus_api.model import Leadership, SessionState, Versioned
from consensus_backends.etcd import _requests as rq
from consensus_backends.etcd._changes import ChangeReader
from consensus_backends.etcd._channel import TLS
from consensus_backends.etcd._client import EtcdClient
from consensus_backends.etcd._errors import CompactedError
from consensus_backends.etcd._layout import Layout, prefix_end
from consensus_backends.etcd._lease import LeaseKeeper
from consensus_backends.etcd._watch import PrefixWatch

if TYPE_CHECKING:
    from consensus_api.conformance.profile import TestProfile

DEFAULT_PORT = 2379

#: Keys per page when listing a namespace.
PAGE_SIZE = 1000

#: Keys (with values) per page of ``walk``.
WALK_PAGE = 256


class EtcdBackend(Backend):
    """One session against an etcd v3 cluster: a lease, a prefix watch and transactions."""

    #: ``tls`` enables the common security options (docs/spec.md section 2).
    options: ClassVar[Mapping[str, OptionParser]] = {"tls": boolean}

    _client: EtcdClient
    _keeper: LeaseKeeper
    _watch: PrefixWatch

    def __init__(self, url: BackendURL, options: Options, events: BackendEvents) -> None:
        super().__init__(url, options, events)
        if not url.endpoints:
            raise ConfigurationError("an etcd:// URL needs at least one host, e.g. etcd://127.0.0.1:2379/app")
        self._layout = Layout.from_path(url.path)
        self._lock = threading.Lock()
        self._owned: set[bytes] = set()
        self._fence_requests = rq.FenceRequests(self._layout)
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
        self._keeper = LeaseKeeper(
            self._client, self.settings.session_timeout, self.settings.request_timeout, self._on_state
        )
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
                on_deleted=self._on_deleted,
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
        """The value and ``mod_revision`` of ``key`` (a linearizable read)."""
        response = self._client.range(etcdrpc.RangeRequest(key=self._layout.key(key)), self._deadline())
        for kv in response.kvs:  # one at most
            return Versioned(bytes(kv.value), int(kv.mod_revision))
        return None

    def put(self, key: str, value: bytes, fence: Leadership | None) -> int:
        """Create ``key`` if ``create_revision == 0``; the new version is the transaction's revision."""
        target = self._layout.key(key)
        response = self._write([rq.created_is(target, 0)], [rq.put(target, value)], [], fence)
        if not response.succeeded:
            raise KeyExistsError(f"key {key!r} already exists")
        return int(response.header.revision)

    def update(self, key: str, value: bytes, version: int | None, fence: Leadership | None) -> int:
        """Replace the value if the key exists (and ``mod_revision == version`` when given)."""
        target = self._layout.key(key)
        response = self._write(
            self._conditions(target, version), [rq.put(target, value)], [rq.read_meta(target)], fence
        )
        if not response.succeeded:
            self._raise_condition(key, version, response)
        return int(response.header.revision)

    def delete(self, key: str, version: int | None, fence: Leadership | None) -> None:
        """Delete the key if it exists (and ``mod_revision == version`` when given)."""
        target = self._layout.key(key)
        response = self._write(
            self._conditions(target, version), [rq.delete(target)], [rq.read_meta(target)], fence
        )
        if not response.succeeded:
            self._raise_condition(key, version, response)

    def keys(self, namespace: str) -> frozenset[str]:
        """The keys one level below ``namespace``: a keys-only prefix scan, in pages at one revision.

        A page that ends inside a child's subtree continues after that whole
        subtree, so deep subtrees cost at most one page each.
        """
        prefix = self._layout.children(namespace)
        deadline = self._deadline()
        while True:
            try:
                children = self._children(prefix, deadline)
            except CompactedError:  # compacted between two pages: start again at a newer revision
                continue
            return frozenset(join_key(namespace, child) for child in children)

    def _children(self, prefix: bytes, deadline: float) -> list[str]:
        end = prefix_end(prefix)
        start, revision, children = prefix, 0, []
        while start < end:
            request = etcdrpc.RangeRequest(
                key=start, range_end=end, keys_only=True, limit=PAGE_SIZE, revision=revision
            )
            response = self._client.range(request, deadline)
            revision = revision or int(response.header.revision)
            for kv in response.kvs:
                child, slash, _ = kv.key[len(prefix) :].partition(b"/")
                if not slash:
                    children.append(child.decode(errors="replace"))
            if not response.more or not response.kvs:
                break
            last = response.kvs[-1].key
            child, slash, _ = last[len(prefix) :].partition(b"/")
            start = prefix_end(prefix + child + b"/") if slash else last + b"\x00"
        return children

    def walk(self, namespace: str) -> Iterator[tuple[str, Versioned]]:
        """A prefix range in pages of ``WALK_PAGE`` keys, all at the first page's revision.

        So the pages form one snapshot, unless that revision is compacted
        meanwhile: the walk then goes on after the last key yielded, at the
        newest revision.
        """
        prefix = self._layout.children(namespace)
        strip = len(self._layout.key(""))
        start, end, revision = prefix, prefix_end(prefix), 0
        while start < end:
            request = etcdrpc.RangeRequest(key=start, range_end=end, limit=WALK_PAGE, revision=revision)
            try:
                response = self._client.range(request, self._deadline())
            except CompactedError:
                revision = 0
                continue
            revision = revision or int(response.header.revision)
            for kv in response.kvs:
                yield (
                    kv.key[strip:].decode(errors="replace"),
                    Versioned(bytes(kv.value), int(kv.mod_revision)),
                )
            if not response.more or not response.kvs:
                return
            start = response.kvs[-1].key + b"\x00"

    # Group membership

    def join(self, group: str, member_id: str, data: bytes) -> None:
        """Create the member key, bound to the lease, if no key has that id."""
        target = self._layout.member(group, member_id)
        if not self._create_leased(target, data, []).succeeded:
            raise MemberExistsError(f"group {group!r} already has a live member {member_id!r}")

    def leave(self, group: str, member_id: str) -> None:
        """Delete the member key if this session's lease holds it."""
        self._release(self._layout.member(group, member_id), f"member {member_id!r} of group {group!r}")

    def membership(self, group: str) -> dict[str, bytes]:
        """The member keys of ``group`` and their data."""
        prefix = self._layout.group(group)
        request = etcdrpc.RangeRequest(key=prefix, range_end=prefix_end(prefix))
        response = self._client.range(request, self._deadline())
        return {kv.key[len(prefix) :].decode(errors="replace"): bytes(kv.value) for kv in response.kvs}

    # Leader election

    def nominate(self, service: str, candidate_id: str) -> bool:
        """Create the candidate key, bound to the lease; True if it is now the oldest candidate."""
        target = self._layout.candidate(service, candidate_id)
        find_oldest = etcdrpc.RequestOp(request_range=rq.oldest(self._layout.election(service)))
        response = self._create_leased(target, b"", [find_oldest])
        if not response.succeeded:
            raise MemberExistsError(f"service {service!r} already has a live candidate {candidate_id!r}")
        kvs = response.responses[1].response_range.kvs
        return bool(kvs) and kvs[0].key == target

    def resign(self, service: str, candidate_id: str) -> None:
        """Delete the candidate key if this session's lease holds it."""
        self._release(
            self._layout.candidate(service, candidate_id), f"candidate {candidate_id!r} for {service!r}"
        )

    def leadership(self, service: str) -> Leadership | None:
        """The oldest candidate and its ``create_revision`` (the term), or None."""
        prefix = self._layout.election(service)
        response = self._client.range(rq.oldest(prefix), self._deadline())
        if not response.kvs:
            return None
        leader = response.kvs[0]
        return Leadership(
            service, leader.key[len(prefix) :].decode(errors="replace"), int(leader.create_revision)
        )

    # Watches

    def watch(self, target: Target) -> None:
        """Report changes of ``target`` (no I/O: the prefix watch already covers it)."""
        self._watch.add(target)

    def unwatch(self, target: Target) -> None:
        """Stop reporting changes of ``target``."""
        self._watch.discard(target)

    def change_reader(self) -> Reader:
        """A value's re-read from its latest watch event where that is provably current (``_changes``)."""
        return ChangeReader(self, self._client, self._watch)

    def server_version(self) -> str | None:
        """The version the etcd member reports in its status (None if it does not answer in time)."""
        try:
            return self._client.status_version(self._deadline())
        except ConsensusError:
            return None

    @classmethod
    def test_profile(cls, url: BackendURL) -> TestProfile:
        """``consensus_backends.etcd.profile``."""
        from consensus_backends.etcd import profile  # noqa: PLC0415 - only tests need it

        return profile.ETCD

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

    def _write(
        self, compare: list[Any], success: list[Any], failure: list[Any], fence: Leadership | None
    ) -> Any:
        """Run a conditional write; ``FencedError`` if ``fence`` is not the current leadership."""
        if fence is not None:
            fence_compares, fence_read = self._fence_requests.get(fence)
            compare = compare + fence_compares
            failure = [*failure, fence_read]
        response = self._client.txn(rq.txn(compare, success, failure), self._deadline())
        if (
            not response.succeeded
            and fence is not None
            and not rq.fence_held(self._layout, fence, response.responses[-1])
        ):
            raise FencedError(f"{fence.leader_id!r} no longer leads {fence.service!r} in term {fence.term}")
        return response

    @staticmethod
    def _conditions(target: bytes, version: int | None) -> list[Any]:
        compare = [rq.exists(target)]
        if version is not None:
            compare.append(rq.modified_is(target, version))
        return compare

    @staticmethod
    def _raise_condition(key: str, version: int | None, response: Any) -> None:
        kvs = response.responses[0].response_range.kvs
        if not kvs:
            raise KeyNotFoundError(f"key {key!r} does not exist")
        raise VersionConflictError(f"key {key!r} is at version {kvs[0].mod_revision}, not {version}")

    def _create_leased(self, target: bytes, value: bytes, then: list[Any]) -> Any:
        """Create ``target`` bound to the session's lease if it does not exist; runs ``then`` too."""
        lease = self._keeper.current()
        request = rq.txn([rq.created_is(target, 0)], [rq.put(target, value, lease), *then], [])
        try:
            response = self._client.txn(request, self._deadline())
        except SessionLostError:
            self._keeper.check_now()
            raise
        if response.succeeded:
            with self._lock:
                self._owned.add(target)
        return response

    def _release(self, target: bytes, what: str) -> None:
        """Delete ``target`` if it is bound to the session's lease.

        Without a lease (the session was lost) the key is gone or will be gone
        before a new lease exists, and so is a key found missing: both count as
        released. A key held by another session is ``NotAMemberError``.
        """
        with self._lock:
            self._owned.discard(target)
        lease = self._keeper.held()
        if lease is None:
            return
        request = rq.txn([rq.leased_by(target, lease)], [rq.delete(target)], [rq.read_meta(target)])
        response = self._client.txn(request, self._deadline())
        if not response.succeeded and response.responses[0].response_range.kvs:
            raise NotAMemberError(f"{what} is held by another session")

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
            with self._lock:
                self._owned.clear()
        elif state is SessionState.CONNECTED:
            self._watch.restart()
        self.events.state_changed(state)

    def _on_deleted(self, key: bytes) -> None:
        """From the watch: one of our own keys vanished, perhaps with our lease; check it now."""
        with self._lock:
            ours = key in self._owned
        if ours:
            self._keeper.check_now()

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
