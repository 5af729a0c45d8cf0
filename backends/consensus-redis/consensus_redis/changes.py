"""The change stream reader: ``XREAD BLOCK`` on the prefix's stream, resumed by entry id.

Every script that changes state appends entries ``<seq>-0`` with fields ``t``
(``v`` value, ``k`` keyset, ``g`` group, ``e`` election) and ``n`` (the name),
``seq`` counting up by one. The reader starts after the last entry present
when the session opens and reports each entry of a watched target through
``changed``. It never loses an event silently: a jump in ``seq`` (entries
trimmed before it read them) or a broken connection (entries may have come
meanwhile) makes it report every watched target, after which it goes on from
the last id it read; a broken connection also makes the heartbeat check
at once. Keyspace notifications are not used: Redis drops them
for a disconnected subscriber.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from consensus_api.backend import Target, TargetKind
from consensus_api.errors import ConsensusError
from consensus_redis.client import RedisClient
from consensus_redis.layout import Layout

log = logging.getLogger("consensus_api.redis")

#: How long one XREAD blocks (ms); it bounds how long ``stop`` waits.
BLOCK_MS = 500
#: Entries per XREAD.
BATCH = 1000
#: Seconds between attempts while the server cannot be reached.
TROUBLE_PAUSE = 0.1

_KINDS = {b"v": TargetKind.VALUE, b"k": TargetKind.KEYSET, b"g": TargetKind.GROUP, b"e": TargetKind.ELECTION}


class ChangeStream:
    """A thread reading the change stream and reporting the watched targets it names."""

    def __init__(
        self,
        client: RedisClient,
        layout: Layout,
        changed: Callable[[Target], None],
        on_trouble: Callable[[], None],
    ) -> None:
        self._client = client
        self._on_trouble = on_trouble
        self._stream = layout.key("changes")
        self._changed = changed
        self._lock = threading.Lock()
        self._watched: set[Target] = set()
        self._stop = threading.Event()
        self._last = 0
        self._thread = threading.Thread(target=self._read, name="consensus-redis-changes", daemon=True)

    def start(self, deadline: float) -> None:
        """Start after the newest entry now in the stream."""
        newest = self._client.command("XREVRANGE", self._stream, "+", "-", "COUNT", 1, deadline=deadline)
        self._last = _seq(newest[0][0]) if newest else 0
        self._thread.start()

    def halt(self) -> None:
        """Stop reading after the current read (closing the pool ends a blocked one at once)."""
        self._stop.set()

    def stop(self, timeout: float) -> None:
        """Stop reading and wait for the reader (within one block, bounded by ``timeout``)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def add(self, target: Target) -> None:
        with self._lock:
            self._watched.add(target)

    def discard(self, target: Target) -> None:
        with self._lock:
            self._watched.discard(target)

    def resync(self) -> None:
        """Report every watched target (the core re-reads each)."""
        with self._lock:
            targets = list(self._watched)
        for target in targets:
            self._changed(target)

    def _read(self) -> None:
        broken = False
        while not self._stop.is_set():
            try:
                reply = self._client.command(
                    *("XREAD", "COUNT", BATCH, "BLOCK", BLOCK_MS, "STREAMS", self._stream, f"{self._last}-0"),
                    deadline=self._client.deadline() + BLOCK_MS / 1000,
                )
            except ConsensusError as exc:
                log.debug("change stream read failed: %s", exc)
                if not broken:
                    self._on_trouble()  # the session may be in trouble too: the heartbeat checks now
                broken = True
                self._stop.wait(TROUBLE_PAUSE)
                continue
            if broken:
                broken = False
                self.resync()
            try:
                for _, entries in reply or ():
                    self._deliver(entries)
            except (ValueError, TypeError, IndexError) as exc:  # never die on a reply we cannot parse
                log.warning("unexpected change stream reply (%s); re-reading every target", exc)
                self.resync()

    def _deliver(self, entries: list[list[Any]]) -> None:
        """Report the watched targets ``entries`` name (``[id, [field, value, ...]]`` each)."""
        gap = False
        found: list[Target] = []
        for entry_id, flat in entries:
            seq = _seq(entry_id)
            gap = gap or seq != self._last + 1
            self._last = seq
            fields = dict(zip(flat[::2], flat[1::2], strict=True))
            kind = _KINDS.get(fields.get(b"t", b""))
            if kind is not None:
                found.append(Target(kind, fields.get(b"n", b"").decode(errors="replace")))
        if gap:
            log.debug("change stream entries were trimmed before they were read; re-reading every target")
            self.resync()
            return
        with self._lock:
            targets = [target for target in dict.fromkeys(found) if target in self._watched]
        for target in targets:
            self._changed(target)


def _seq(entry_id: bytes) -> int:
    return int(entry_id.split(b"-", 1)[0])
