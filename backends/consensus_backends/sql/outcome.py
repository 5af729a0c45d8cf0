"""How a SQL backend transaction ended, in ``consensus_api.errors``: shared by the blocking calls
(``SQLBackend._run``) and PostgreSQL's asyncio storage (``sql.asyncio``), so both raise the same."""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy
from sqlalchemy import Engine

from consensus_api.errors import (
    BackendUnavailableError,
    ConsensusError,
    OperationTimeoutError,
    PermissionDeniedError,
    SessionLostError,
)
from consensus_backends.sql.errors import connect_refusal, denied, describe_error, is_retryable
from consensus_backends.sql.writelock import is_busy


@dataclass
class Progress:
    """How far one transaction got: ``begun`` (past ``BEGIN``), ``committing`` (its COMMIT sent)."""

    begun: bool = False
    committing: bool = False


def connect_failure(exc: sqlalchemy.exc.DBAPIError, url: str, engine: Engine) -> tuple[bool, ConsensusError]:
    """A failure to connect to ``url`` (redacted): whether another attempt may help, and what to
    raise when none is made."""
    refused = connect_refusal(exc, url)
    if refused is not None:
        return False, refused
    return True, BackendUnavailableError(f"cannot reach {url}: {describe_error(exc, engine)}")


def no_connection(backend: str) -> OperationTimeoutError:
    """Every pooled connection stayed busy for ``request_timeout``."""
    return OperationTimeoutError(
        f"no free {backend} connection in the pool within request_timeout; not applied", not_applied=True
    )


def transaction_failure(
    exc: sqlalchemy.exc.DBAPIError,
    progress: Progress,
    backend: str,
    engine: Engine,
    *,
    retry: bool,
    cut: bool,
) -> tuple[bool, ConsensusError]:
    """A transaction that raised ``exc`` after ``progress``: whether running it again is safe (a
    deadlock, a serialization failure; with ``retry`` a broken connection before the commit was
    sent; SQLite's write lock never taken), and what to raise when it is not run again. ``cut``:
    its connection was cut at its deadline."""
    if isinstance(exc, sqlalchemy.exc.IntegrityError):
        return False, SessionLostError("this session's lease has expired; it is being re-established")
    if denied(exc):  # a refused statement: the transaction is rolled back
        return False, PermissionDeniedError(
            f"{backend} refused the call ({describe_error(exc, engine)}); not applied"
        )
    stale = retry and exc.connection_invalidated and not progress.committing and not cut
    locked_out = not progress.begun and is_busy(exc)  # SQLite: it never got the write lock
    again = stale or locked_out or is_retryable(exc)
    return again, unfinished(
        backend, progress, "no answer within request_timeout" if cut else describe_error(exc, engine)
    )


def unfinished(backend: str, progress: Progress, reason: str) -> OperationTimeoutError:
    """A transaction that did not complete for ``reason``: not applied unless its COMMIT was sent."""
    if not progress.committing:  # no COMMIT was sent: the database rolls the transaction back
        return OperationTimeoutError(
            f"{backend} did not complete the call ({reason}) before its commit; it was not applied",
            not_applied=True,
        )
    return OperationTimeoutError(f"{backend} did not complete the call ({reason}); its effect is unknown")
