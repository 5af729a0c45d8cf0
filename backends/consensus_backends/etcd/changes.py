"""One etcd watch over the backend's whole prefix, resumed without gaps.

Every event is mapped to the watched targets its key touches, and each of
those gets ``changed(target)``. The watch remembers the last revision it has
fully handled: the highest event revision, or the revision of a progress
notification. When the stream ends (server restart, lost connection, or a
``restart()`` after connection trouble) a thread of ours subscribes again from
that revision + 1, so nothing is missed. If that revision has been compacted
away, it subscribes from the current revision and reports every watched
target as changed (a full resync). Callbacks from pyetcd's watch thread only
update state under a lock and hand targets on; they never block.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from pyetcd.events import DeleteEvent
from pyetcd.exceptions import RevisionCompactedError
from pyetcd.watch import WatchResponse

from consensus_api.backend import Target, TargetKind
from consensus_api.errors import ConsensusError
from consensus_backends.etcd.client import EtcdClient
from consensus_backends.etcd.errors import CompactedError
from consensus_backends.etcd.layout import Layout, prefix_end

log = logging.getLogger("consensus_api.etcd")

#: Bounds of the pause between failed subscription attempts (doubling).
RETRY_MIN = 0.1
RETRY_MAX = 1.0


class PrefixWatch:
    """Reports changes of watched targets from one resumable watch of ``layout.everything``."""

    def __init__(
        self,
        client: EtcdClient,
        layout: Layout,
        *,
        revision: int,
        request_timeout: float,
        changed: Callable[[Target], None],
        on_trouble: Callable[[], None],
        on_deleted: Callable[[bytes], None],
    ) -> None:
        """Watch every change after ``revision`` (a revision read before any target is added)."""
        self._client = client
        self._layout = layout
        self._request_timeout = request_timeout
        self._changed = changed
        self._on_trouble = on_trouble
        self._on_deleted = on_deleted
        self._cond = threading.Condition()
        self._targets: set[Target] = set()
        #: Watched keys' latest event: (mod_revision, value or None if deleted); exact states.
        self._values: dict[str, tuple[int, bytes | None]] = {}
        self._last = revision
        self._generation = 0
        self._resubscribe = True
        self._resync = False
        self._stopped = False
        self._close_stream: Callable[[], None] | None = None
        self._thread = threading.Thread(target=self._run, name="consensus-etcd-watch", daemon=True)
        self._thread.start()

    def add(self, target: Target) -> None:
        """Report changes of ``target`` from now on."""
        with self._cond:
            self._targets.add(target)

    def discard(self, target: Target) -> None:
        """Stop reporting changes of ``target``."""
        with self._cond:
            self._targets.discard(target)
            if target.kind is TargetKind.VALUE:
                self._values.pop(target.name, None)

    def value(self, key: str) -> tuple[int, bytes | None] | None:
        """The watched ``key``'s state as of its latest event: ``(mod_revision, value)``, value None
        once deleted; None if no event of it arrived since it was added or the watch resynced."""
        with self._cond:
            return self._values.get(key)

    def restart(self) -> None:
        """Replace the stream (it may be dead without knowing it), resuming after the last revision."""
        with self._cond:
            self._resubscribe = True
            self._cond.notify_all()

    def stop(self, deadline: float) -> None:
        """End the watch, and its thread unless that is still busy at ``deadline``."""
        with self._cond:
            self._stopped = True
            close, self._close_stream = self._close_stream, None
            self._cond.notify_all()
        if close is not None:
            close()
        self._thread.join(max(deadline - time.monotonic(), 0))

    def _run(self) -> None:
        pause = RETRY_MIN
        while True:
            with self._cond:
                while not (self._resubscribe or self._stopped):
                    self._cond.wait()
                if self._stopped:
                    return
                self._resubscribe = False
                self._generation += 1
                generation = self._generation
                close, self._close_stream = self._close_stream, None
            if close is not None:
                close()
            try:
                self._subscribe(generation)
                pause = RETRY_MIN
            except ConsensusError as exc:
                log.debug("subscribing to etcd's watch failed (%s); retrying in %.1fs", exc, pause)
                if not isinstance(exc, CompactedError):
                    self._on_trouble()
                with self._cond:
                    if isinstance(exc, CompactedError):
                        self._resync = True
                        self._values.clear()
                    self._resubscribe = True
                    self._cond.wait(pause)
                pause = min(pause * 2, RETRY_MAX)
            except Exception:
                log.exception("unexpected error in the etcd watch thread; it keeps running")
                with self._cond:
                    self._resubscribe = True
                    self._cond.wait(RETRY_MAX)

    def _subscribe(self, generation: int) -> None:
        deadline = time.monotonic() + self._request_timeout
        with self._cond:
            resync, start = self._resync, self._last + 1
        if resync:
            log.warning("etcd compacted the revisions this watch missed; re-reading every watched target")
            start = self._client.revision(self._layout.everything, deadline) + 1
        prefix = self._layout.everything
        callback = functools.partial(self._on_response, generation)
        close = self._client.subscribe(prefix, prefix_end(prefix), start, callback, deadline)
        with self._cond:
            if generation != self._generation or self._stopped:
                stale = True
            else:
                stale = False
                self._close_stream = close
                if resync:
                    self._resync = False
                    self._last = max(self._last, start - 1)
                targets = list(self._targets) if resync else []
        if stale:
            close()
            return
        for target in targets:
            self._changed(target)

    def _on_response(self, generation: int, response: Any) -> None:
        """On pyetcd's watch thread: map events to targets; on an error, ask for a new stream."""
        hits: list[Target] = []
        deleted: list[bytes] = []
        trouble = False
        with self._cond:
            if generation != self._generation or self._stopped:
                return
            if isinstance(response, WatchResponse):
                for event in response.events:
                    self._last = max(self._last, event.mod_revision)
                    touched = [t for t in self._layout.targets(event.key) if t in self._targets]
                    for target in touched:
                        if target.kind is TargetKind.VALUE:
                            value = None if isinstance(event, DeleteEvent) else bytes(event.value)
                            self._values[target.name] = (int(event.mod_revision), value)
                    hits.extend(touched)
                    if isinstance(event, DeleteEvent):
                        deleted.append(event.key)
                if not response.events:  # a progress notification: everything up to here was sent
                    self._last = max(self._last, response.header.revision)
            else:
                if isinstance(response, RevisionCompactedError):
                    self._resync = True
                    self._values.clear()  # events were missed: the latest ones are not the state
                else:
                    trouble = True
                    log.debug(
                        "etcd's watch stream ended (%s); resuming after revision %d",
                        _describe(response),
                        self._last,
                    )
                self._resubscribe = True
                self._cond.notify_all()
        for target in dict.fromkeys(hits):
            self._changed(target)
        for key in deleted:
            self._on_deleted(key)
        if trouble:
            self._on_trouble()


def _describe(error: Any) -> str:
    code = getattr(error, "code", None)
    return str(code()) if callable(code) else repr(error)
