"""Following the source after the copy: every change is copied until the follower is stopped.

Mechanics. The source reports ``(path, state)`` after each change (listeners
or watches); a rescanner thread walks the source every ``rescan_interval``
and reports every path whose value differs from what was last copied (this
finds keys in namespaces no listener could know of, and is a safety net).
Reports are coalesced per path into ``Hints``. One thread -- the caller's --
takes them in batches: a path whose reported state equals what was last
copied is done; for every other path the *current* source value is fetched
and applied through the ``Copier``. Because the applying thread always reads
the source afresh, applied states never go back in time, and because the
source's last report for a path equals its final state, the target converges
on the source's final state of every path. Target values the migration did
not write (a client already switched to the target wrote them) are never
overwritten: they are counted as conflicts.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from consensus_api.errors import ConsensusError
from consensus_api.migrate.copier import Copier, Item
from consensus_api.migrate.ledger import Digest, digest
from consensus_api.migrate.source import Source

log = logging.getLogger("consensus_api.migrate")

#: Paths per applied batch.
BATCH = 256

#: Seconds between polls of the hint queue (and of the stop event).
POLL = 0.2

#: Seconds to wait before retrying a batch whose writes failed for a passing reason.
RETRY_PAUSE = 1.0


class Hints:
    """Paths reported changed, with the digest of their reported state; the latest report wins."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._pending: dict[str, Digest] = {}

    def put(self, path: str, state: Digest, *, replace: bool = True) -> None:
        """Add a report (with ``replace=False`` only if none is pending for ``path``)."""
        with self._cond:
            if path in self._pending:
                if not replace:
                    return
                del self._pending[path]
            self._pending[path] = state
            self._cond.notify()

    def take(self, limit: int, timeout: float) -> dict[str, Digest]:
        """Up to ``limit`` of the oldest reports, waiting at most ``timeout`` for the first."""
        with self._cond:
            self._cond.wait_for(lambda: bool(self._pending), timeout)
            taken: dict[str, Digest] = {}
            for path in list(self._pending)[:limit]:
                taken[path] = self._pending.pop(path)
            return taken

    def __len__(self) -> int:
        with self._cond:
            return len(self._pending)


class Follower:
    """Copies the source's changes below ``prefix`` to the target until ``run``'s stop event is set."""

    def __init__(
        self,
        source: Source,
        copier: Copier,
        prefix: str,
        copied: dict[str, Digest],
        apply: Callable[[list[Item]], None],
        *,
        rescan_interval: float,
        idle: Callable[[int], None],
    ) -> None:
        """``copied``: path -> digest of the source state last copied (shared, updated by ``apply``)."""
        self._source = source
        self._copier = copier
        self._prefix = prefix
        self._copied = copied
        self._apply = apply
        self._rescan_interval = rescan_interval
        self._idle = idle
        self._hints = Hints()
        self._lock = threading.Lock()

    def run(self, stop: threading.Event) -> None:
        """Follow until ``stop`` is set (or the caller is interrupted)."""
        follow = self._source.follow(self._prefix, self._report)
        rescanner = threading.Thread(
            target=self._rescan_loop, args=(stop, follow.add), name="consensus-migrate-rescan", daemon=True
        )
        try:
            with self._lock:
                known = list(self._copied)
            follow.add(known)
            rescanner.start()
            while not stop.is_set():
                taken = self._hints.take(BATCH, POLL)
                if not taken:
                    self._idle(0)
                    continue
                with self._lock:
                    stale = [path for path, state in taken.items() if self._copied.get(path) != state]
                try:
                    self._bring_in_line(stale)
                except ConsensusError as exc:
                    log.warning("copying %d changes failed (%s); retrying", len(stale), exc)
                    for path in stale:
                        self._hints.put(path, taken[path], replace=False)
                    stop.wait(RETRY_PAUSE)
                self._idle(len(self._hints))
        finally:
            stop.set()
            follow.close()
            if rescanner.is_alive():
                rescanner.join(POLL * 5)

    def _bring_in_line(self, paths: list[str]) -> None:
        if not paths:
            return
        values = self._copier.gather(self._source.fetch, paths)
        self._apply([Item(path, values[path]) for path in paths])
        with self._lock:
            for path in paths:
                self._copied[path] = digest(values[path])

    def _report(self, path: str, value: bytes | None) -> None:
        self._hints.put(path, digest(value))

    def _rescan_loop(self, stop: threading.Event, track: Callable[[list[str]], None]) -> None:
        while not stop.wait(self._rescan_interval):
            started = time.monotonic()
            try:
                found = self._rescan(stop, track)
            except ConsensusError as exc:
                log.warning("rescanning the source failed (%s); trying again later", exc)
                continue
            log.debug("rescan: %d paths differ (%.1f s)", found, time.monotonic() - started)

    def _rescan(self, stop: threading.Event, track: Callable[[list[str]], None]) -> int:
        """Report every path whose walked state differs from the last copied one."""
        seen: set[str] = set()
        found = 0
        for path, value in self._source.walk(self._prefix):
            if stop.is_set():
                return found
            seen.add(path)
            state = digest(value)
            with self._lock:
                known, copied = path in self._copied, self._copied.get(path)
            if not known:
                track([path])
            if copied != state:
                self._hints.put(path, state, replace=False)
                found += 1
        with self._lock:
            vanished = [
                path for path, state in self._copied.items() if state is not None and path not in seen
            ]
        for path in vanished:
            self._hints.put(path, None, replace=False)
        return found + len(vanished)
