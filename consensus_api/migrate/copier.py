"""Deciding and making the target's writes: conditional, announced in the ledger, in parallel.

Per key the copier compares the source's value with the target's and asks
the ledger whether the target's value is the migration's own:

=====================  ========================  ==========================
source vs target        target value owned        not owned
=====================  ========================  ==========================
equal                   unchanged                 adopt (recorded as owned)
target absent           create (``put``)          conflict
source absent           delete (at its version)   conflict
both present, differ    update (at its version)   conflict
=====================  ========================  ==========================

``overwrite`` treats every target value as owned. Every write is
conditional on the target state the decision was made on (``put`` only if
absent, ``update``/``delete`` only at the version read): a write that finds
the target changed meanwhile re-reads it and decides again, so no value
someone else wrote in between is clobbered. Once a write is done, a later
ledger record confirms it (``(after, after)``): from then on only the value
written is the migration's, so a client that later deletes the key or writes
the old value back is not overridden by a re-run.
"""

from __future__ import annotations

import enum
import queue
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from consensus_api.errors import KeyExistsError, KeyNotFoundError, VersionConflictError
from consensus_api.migrate.ledger import Digest, Ledger, digest
from consensus_api.storage import Storage

R = TypeVar("R")

#: How often one key's write is decided again after finding the target changed.
ATTEMPTS = 4


class Action(enum.Enum):
    """What the migration did (or, in a dry run, would do) with one key."""

    CREATE = "create"
    UPDATE = "update"
    DELETE = "delete"
    UNCHANGED = "unchanged"
    ADOPT = "adopt"
    CONFLICT = "conflict"


WRITES = (Action.CREATE, Action.UPDATE, Action.DELETE)


@dataclass(frozen=True, slots=True)
class TargetState:
    """A target key's value digest (None: absent) and version, as read."""

    digest: Digest
    version: int | None = None


ABSENT = TargetState(None)


@dataclass(frozen=True, slots=True)
class Item:
    """One key to bring in line with the source: its source value (None: absent there)."""

    key: str
    value: bytes | None

    @property
    def digest(self) -> Digest:
        """The digest of the source value."""
        return digest(self.value)


def decide(ledger: Ledger, key: str, source: Digest, target: TargetState, overwrite: bool) -> Action:
    """The action for one key (see the module's table)."""
    if source == target.digest:
        return Action.UNCHANGED if source is None or ledger.owns(key, source) else Action.ADOPT
    if not (overwrite or ledger.owns(key, target.digest)):
        return Action.CONFLICT
    if target.digest is None:
        return Action.CREATE
    return Action.DELETE if source is None else Action.UPDATE


class Copier:
    """Applies batches of items to the target with ``workers`` threads."""

    def __init__(
        self, target: Storage, ledger: Ledger, *, overwrite: bool, dry_run: bool, workers: int
    ) -> None:
        self._target = target
        self._ledger = ledger
        self._overwrite = overwrite
        self._dry_run = dry_run
        self._pool = ThreadPoolExecutor(max(1, workers), thread_name_prefix="consensus-migrate")
        self._running: dict[Future[Action], tuple[Item, Callable[[str, Action], None]]] = {}
        self._confirmed: dict[str, tuple[Digest, Digest]] = {}
        self._finished: queue.SimpleQueue[Future[Action]] = queue.SimpleQueue()

    def close(self) -> None:
        """Drop queued writes and wait for the running ones (each bounded by request_timeout)."""
        self._pool.shutdown(wait=True, cancel_futures=True)

    def gather(self, read: Callable[[str], R], keys: Iterable[str]) -> dict[str, R]:
        """``read(key)`` for each of ``keys``, in parallel."""
        futures = {key: self._pool.submit(read, key) for key in keys}
        return {key: future.result() for key, future in futures.items()}

    def state(self, key: str) -> TargetState:
        """The target's current state of ``key``."""
        found = self._target.fetch(key)
        return ABSENT if found is None else TargetState(digest(found.value), found.version)

    def apply(
        self,
        items: list[Item],
        states: dict[str, TargetState],
        done: Callable[[str, Action], None],
        *,
        overwrite: bool | None = None,
        window: int = 0,
    ) -> None:
        """Bring each item's key in line; ``done(key, action)`` runs on this thread as each finishes.

        ``states`` holds the target state each decision starts from. The ledger
        record for the batch is written before any of its writes. Returns once
        at most ``window`` writes (of this and earlier calls) are still running;
        ``finish`` waits for the rest. A key must not be in two running calls.
        """
        forced = self._overwrite if overwrite is None else overwrite
        actions = {
            item.key: decide(self._ledger, item.key, item.digest, states[item.key], forced) for item in items
        }
        if self._dry_run:
            for item in items:
                done(item.key, actions[item.key])
            return
        intents = {
            item.key: (states[item.key].digest, item.digest)
            for item in items
            if actions[item.key] in (*WRITES, Action.ADOPT)
        }
        self._ledger.record({**self._take_confirmations(), **intents})
        for item in items:
            action = actions[item.key]
            if action in WRITES:
                future = self._pool.submit(self._write, item, action, states[item.key], forced)
                self._running[future] = (item, done)
                future.add_done_callback(self._finished.put)
            else:
                done(item.key, action)
        self._drain(window)

    def finish(self) -> None:
        """Wait for every running write (calling their ``done``) and record that they are done."""
        self._drain(0)

    def _drain(self, window: int) -> None:
        try:
            while len(self._running) > window:
                future = self._finished.get()
                item, done = self._running.pop(future)
                action = future.result()
                if action in WRITES:
                    self._confirmed[item.key] = (item.digest, item.digest)
                done(item.key, action)
        except BaseException:
            for future in self._running:
                future.cancel()
            self._running.clear()
            raise
        if not self._running:
            self._ledger.record(self._take_confirmations())

    def _take_confirmations(self) -> dict[str, tuple[Digest, Digest]]:
        """Completed writes: their value is now the only one the migration owns (see ``ledger``)."""
        confirmed, self._confirmed = self._confirmed, {}
        return confirmed

    def _write(self, item: Item, action: Action, state: TargetState, forced: bool) -> Action:
        """Make one conditional write; on a changed target read it again and decide again."""
        for _ in range(ATTEMPTS):
            try:
                if action is Action.CREATE:
                    assert item.value is not None
                    self._target.put(item.key, item.value)
                elif action is Action.UPDATE:
                    assert item.value is not None
                    self._target.update(item.key, item.value, version=state.version)
                elif action is Action.DELETE:
                    self._target.delete(item.key, version=state.version)
                return action
            except (KeyExistsError, KeyNotFoundError, VersionConflictError):
                state = self.state(item.key)
                action = decide(self._ledger, item.key, item.digest, state, forced)
                if action in (Action.UNCHANGED, Action.CONFLICT):
                    return action
                self._ledger.record({item.key: (state.digest, item.digest)})
                if action is Action.ADOPT:
                    return action
        return Action.CONFLICT
