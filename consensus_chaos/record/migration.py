"""The migration driver of a cutover run: the data follower, the cut-over half-way, the final state.

It journals as process ``MIGRATION_PROCESS`` (kind ``migration``): the ``follow`` operation (from
the follower's start to its stop, ``value`` what it wrote), each ``cutover`` attempt
(``consensus_api.migrate.cutover``: ``ok`` with ``term`` the floor set on the new store, ``fail``
with the refusal's error), and at the end one ``final`` event per counter: the new store's value,
read directly (not bridged), with ``store`` ``new``. Before the clients start it creates the counters
(``0``) and the fenced keys on the old store. Every wait is bounded.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

from consensus_api.errors import ConsensusError
from consensus_api.migrate import Migration
from consensus_api.migrate.cutover import cutover
from consensus_api.session import connect
from consensus_chaos.record.cutover import counters, fenced_key, names
from consensus_chaos.record.journal import Journal
from consensus_chaos.record.schema import EVENT, FAIL, INFO, INVOKE, MIGRATION, NEW_STORE, OK

#: Seconds between two cut-over attempts (a refusal: a killed client's session not yet expired...).
RETRY = 1.0
#: Seconds one cut-over may take to catch up with the sealed old store.
CUTOVER_TIMEOUT = 30.0
#: Seconds the follower may take to stop.
STOP_TIMEOUT = 30.0


def bridged_cutover(old: str, new: str, options: Mapping[str, Any]) -> Any:
    """The product's cut-over (``force``: a store that cannot list its sessions has only bridged
    clients here, the runner's own sessions closed)."""
    return cutover(old, new, force=True, timeout=CUTOVER_TIMEOUT, options=options)


class MigrationDriver:
    """The old store, the new one and the steps between them (module docstring)."""

    def __init__(self, old: str, new: str, prefix: str, journal: Journal, options: Mapping[str, Any]) -> None:
        self.old = old
        self.new = new
        self.prefix = prefix
        self.journal = journal
        self.options = dict(options)
        self.seq = 0
        self.cutover_done = threading.Event()
        self._stop = threading.Event()
        self._follower: threading.Thread | None = None
        self._follow_seq = 0

    def _op(self, f: str, type_: str, seq: int, **fields: Any) -> None:
        self.journal.write({"kind": MIGRATION, "f": f, "type": type_, "seq": seq, **fields})

    def prepare(self) -> None:
        """Create the counters (``0``) and the fenced keys on the old store."""
        service, lock = names(self.prefix)
        with connect(self.old, **self.options) as session:
            for key in [*counters(self.prefix), fenced_key(service), fenced_key(lock)]:
                session.storage.put(key, b"0" if key in counters(self.prefix) else b"-")

    def start_following(self) -> None:
        """Copy the prefix to the new store, then follow the old store's changes until ``stop_following``."""
        self.seq += 1
        self._follow_seq = self.seq
        self._op("follow", INVOKE, self.seq, value=f"{self.prefix} -> new")
        self._follower = threading.Thread(target=self._follow, name="chaos-follower", daemon=True)
        self._follower.start()

    def _follow(self) -> None:
        try:
            with Migration(self.old, self.new, prefix=self.prefix, options=self.options) as migration:
                report = migration.copy()
                migration.follow(self._stop, report=report)
        except ConsensusError as exc:
            self._op("follow", INFO, self._follow_seq, error=type(exc).__name__, value=str(exc)[:200])
            return
        self._op("follow", OK, self._follow_seq, value=f"{report.written} keys written")

    def stop_following(self) -> None:
        """Stop the follower (its sessions on the old store close: the cut-over would count them)."""
        self._stop.set()
        if self._follower is not None:
            self._follower.join(STOP_TIMEOUT)

    def cutover(self, deadline: float) -> None:
        """Stop following, then try the cut-over until it succeeds or ``deadline``; each attempt journaled."""
        self.stop_following()
        while time.monotonic() < deadline:
            self.seq += 1
            self._op("cutover", INVOKE, self.seq, value="old -> new")
            try:
                marker = bridged_cutover(self.old, self.new, self.options)
            except ConsensusError as exc:
                self._op("cutover", FAIL, self.seq, error=type(exc).__name__, value=str(exc)[:300])
                time.sleep(RETRY)
                continue
            floor = getattr(marker, "floor", None)
            self._op(
                "cutover", OK, self.seq, value="old -> new", term=floor if isinstance(floor, int) else None
            )
            self.cutover_done.set()
            return

    def record_final(self) -> None:
        """One ``final`` event per counter: its value on the new store, read directly."""
        with connect(self.new, **self.options) as session:
            for key in counters(self.prefix):
                found = session.storage.fetch(key)
                value = None if found is None else found.value.decode("utf-8", "backslashreplace")
                version = None if found is None else found.version
                fields = {"key": key, "value": value, "version": version, "store": NEW_STORE}
                self.journal.write({"kind": MIGRATION, "type": EVENT, "f": "final", **fields})
