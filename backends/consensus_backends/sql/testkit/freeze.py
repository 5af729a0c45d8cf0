"""How the frozen-leader tests stop a SQL client inside its write (``TestProfile.stop_inside_write``).

Test kit code, run in the test's worker process and nowhere else: the backend
knows nothing of it. ``stop_inside_write(key)`` listens to SQLAlchemy's
events on every ``Engine`` of the process; the next transaction that writes
``key`` (an INSERT, UPDATE or DELETE bound to it) stops the process (SIGSTOP)
as it is about to commit: after all its statements, the fence check's
included, holding the locks they took (SQLite's write lock, PostgreSQL's and
MariaDB's row locks), before the COMMIT is sent. Then it disarms: one stop per
call. A transaction that rolls back instead (e.g. a deadlock the backend
retries) does not stop; the retry that commits does.
"""

from __future__ import annotations

import os
import signal
import threading
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, Engine, RootTransaction, event
from sqlalchemy.engine.default import DefaultExecutionContext
from sqlalchemy.engine.interfaces import DBAPICursor, ExecutionContext


class _WriteStop:
    """The armed key and the open transactions that wrote it, shared by the listeners' threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._listening = False
        self._key: str | None = None
        #: Weakly held: a transaction that ended without a commit drops out.
        self._writing: weakref.WeakSet[RootTransaction] = weakref.WeakSet()

    def arm(self, key: str) -> None:
        with self._lock:
            if not self._listening:
                event.listen(Engine, "after_cursor_execute", self._executed)
                event.listen(Engine, "commit", self._committing)
                self._listening = True
            self._key = key
            self._writing.clear()

    def _executed(  # noqa: PLR0917 - SQLAlchemy's listener signature
        self,
        conn: Connection,
        cursor: DBAPICursor,
        statement: str,
        parameters: Sequence[Any] | Mapping[str, Any],
        context: ExecutionContext | None,
        executemany: bool,
    ) -> None:
        """Remember ``conn``'s transaction if this statement wrote the armed key."""
        key, transaction = self._key, conn.get_transaction()
        writes = isinstance(context, DefaultExecutionContext) and context.is_crud
        if key is None or transaction is None or not writes or executemany:
            return
        values = parameters.values() if isinstance(parameters, Mapping) else parameters
        if any(value in (key, key.encode()) for value in values):  # MySQL binds names as bytes
            with self._lock:
                self._writing.add(transaction)

    def _committing(self, conn: Connection) -> None:
        """Stop the process if the transaction about to commit wrote the armed key (then disarm)."""
        transaction = conn.get_transaction()
        with self._lock:
            stops = transaction is not None and transaction in self._writing
            if stops:
                self._key = None
                self._writing.clear()
        if stops:
            os.kill(os.getpid(), signal.SIGSTOP)


_STOP = _WriteStop()


def stop_inside_write(key: str) -> None:
    """Arm the stop: the next transaction of this process that writes ``key`` stops the process
    just before its commit; ``SIGCONT`` resumes it and the commit proceeds."""
    _STOP.arm(key)
