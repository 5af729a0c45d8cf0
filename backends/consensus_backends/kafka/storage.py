"""Key-value storage on the replicated command log.

Writes are commands appended to the log and decided in log order by every
session's state machine (``state``): all sessions agree which of two racing
conditional writes won, and a fenced write is checked in log order against the
service's lease, atomically with the write. Reads first catch up with the log's
end offset (``commandlog.CommandLog.sync``), so they are linearizable. Versions
are log offsets plus one.

The seal is a ``seal`` command in the same log. Proof that once ``seal``
returns every write of any session is refused, and that a write racing it is
either applied before it or refused: ``seal`` returns only once this session's
reader has applied its command, at some offset S of the single partition. A
write is a command at one offset W, never S, and every session decides it
from the commands below W, in the same order: if W < S it was decided before
the seal, whatever it became; if W > S the state machine has the store sealed
there (until an ``unseal`` above S) and refuses it, the same in every session,
and its writer learns that outcome (``SealedError``) from its own reader. A
write sent after ``seal`` returned is appended after S's acknowledgement, so
W > S. The check is one flag read by the state machine per write.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from consensus_api.errors import (
    FencedError,
    KeyExistsError,
    KeyNotFoundError,
    SealedError,
    VersionConflictError,
)
from consensus_api.model import Leadership, Versioned
from consensus_backends.kafka.commandlog import CommandLog
from consensus_backends.kafka.groups import Groups
from consensus_backends.kafka.records import Command, Op
from consensus_backends.kafka.state import Outcome, Result, StateMachine


class Storage:
    """The keys and values of one session; each call is bounded by ``request_timeout``."""

    def __init__(self, log_: CommandLog, state: StateMachine, groups: Groups, request_timeout: float) -> None:
        self._log = log_
        self._state = state
        self._groups = groups
        self._timeout = request_timeout

    def fetch(self, key: str) -> Versioned | None:
        self._log.sync(self._deadline())
        return self._state.get(key)

    def keys(self, namespace: str) -> frozenset[str]:
        self._log.sync(self._deadline())
        return self._state.children(namespace)

    def walk(self, namespace: str) -> Iterator[tuple[str, Versioned]]:
        """The state machine's keys below ``namespace`` once it has caught up with the log's end.

        One snapshot at one log offset, already in memory: no paging is needed.
        """
        self._log.sync(self._deadline())
        yield from self._state.below(namespace)

    def put(self, key: str, value: bytes, fence: Leadership | None) -> int:
        outcome = self._write(Command(Op.PUT, key, value=value, fence=fence))
        if outcome.result is Result.EXISTS:
            raise KeyExistsError(f"key {key!r} already exists")
        return outcome.number

    def update(self, key: str, value: bytes, version: int | None, fence: Leadership | None) -> int:
        return self._write(Command(Op.UPDATE, key, value=value, version=version, fence=fence)).number

    def delete(self, key: str, version: int | None, fence: Leadership | None) -> None:
        self._write(Command(Op.DELETE, key, version=version, fence=fence))

    def seal(self, sealed: bool) -> None:
        """Append ``seal`` (or ``unseal``) and return once this session applied it."""
        self._log.command(Command(Op.SEAL if sealed else Op.UNSEAL, ""), self._deadline())

    def sealed(self) -> bool:
        """Whether the store is sealed, as of the log's end when called (linearizable)."""
        self._log.sync(self._deadline())
        return self._state.sealed()

    def _write(self, command: Command) -> Outcome:
        if command.fence is not None:
            self._groups.check_fence(command.fence)
        outcome = self._log.command(command, self._deadline())
        key = command.name
        if outcome.result is Result.SEALED:
            raise SealedError(f"the store is sealed (a migration's cut-over): writing {key!r} was refused")
        if outcome.result is Result.FENCED:
            fence = command.fence
            assert fence is not None
            raise FencedError(f"the leadership of {fence.service!r} (term {fence.term}) is no longer current")
        if outcome.result is Result.NOT_FOUND:
            raise KeyNotFoundError(f"key {key!r} does not exist")
        if outcome.result is Result.CONFLICT:
            raise VersionConflictError(f"key {key!r} is at version {outcome.number}, not {command.version}")
        return outcome

    def _deadline(self) -> float:
        return time.monotonic() + self._timeout
