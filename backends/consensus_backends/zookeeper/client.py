"""Bounded, pipelined requests over a backend session's kazoo client (``lease.Connection``).

Guarantees:

* ``run`` returns within its deadline; kazoo exceptions never escape: semantic
  ones (``NoNodeError``...) come back as values, the rest become
  ``ConsensusError``\\ s. Reads retry across connection loss until the deadline;
  a write whose connection broke is ``OperationTimeoutError`` (effect unknown).
* No call spans two sessions: a call begun before a LOST raises ``SessionLostError``
  (a write only if it was not sent yet).
* ``read`` with a barrier is linearizable: a no-op quorum write goes first.
* ``answered_lately`` says whether a request was answered within the last third of
  the session timeout (kazoo's ping interval).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from kazoo import exceptions as kz
from kazoo.client import KazooClient
from kazoo.handlers.threading import KazooTimeoutError

from consensus_api.config import BackendURL, Options
from consensus_api.errors import (
    ConfigurationError,
    ConsensusError,
    OperationTimeoutError,
    PermissionDeniedError,
    SessionLostError,
)

#: Errors that describe the data, for the caller to interpret.
SEMANTIC = (
    kz.NoNodeError,
    kz.NodeExistsError,
    kz.BadVersionError,
    kz.NotEmptyError,
    kz.RolledBackError,
    kz.RuntimeInconsistency,
)
#: Errors of the connection or session: the request may or may not have been applied.
TRANSIENT = (kz.ConnectionLoss, kz.SessionExpiredError, kz.OperationTimeoutError, kz.SessionMovedError)

Build = Callable[[KazooClient], Sequence[Any]]


#: Seconds before a batch is sent again after a connection problem (kazoo may not have noticed
#: the broken connection yet).
TRANSIENT_PAUSE = 0.01


def behind_barrier(build: Build, barrier: str) -> Build:
    """``build``'s requests behind a no-op quorum write on ``barrier`` (the first outcome)."""

    def with_barrier(client: KazooClient) -> list[Any]:
        transaction = client.transaction()
        transaction.check(barrier, -1)
        return [transaction.commit_async(), *build(client)]

    return with_barrier


class TransientError(Exception):
    """A request failed because of the connection; raised inside this package only."""


class Gate(Protocol):
    """What requests ask of the session they are sent in (``lease.Connection``)."""

    @property
    def losses(self) -> int:
        """How many times a session was lost: a request begun before it changed spans two sessions."""

    @property
    def closing(self) -> bool:
        """Whether the session was closed."""

    def wait_connected(self, losses: int, deadline: float) -> bool:
        """Wait until connected; False early on a session loss, close, TLS refusal or the deadline."""

    @property
    def connected(self) -> bool:
        """Whether the session is connected now (never waits)."""


class Pipeline:
    """The requests of one kazoo client, sent in the session ``gate`` keeps (the connection's)."""

    def __init__(self, client: KazooClient, url: BackendURL, settings: Options, gate: Gate) -> None:
        self.client = client
        self._url = url
        self._settings = settings
        self._gate = gate
        #: ``time.monotonic()`` when a request sent through ``run`` was last answered.
        self._answered_at = float("-inf")  # nothing answered yet

    def run(self, build: Build, deadline: float, *, idempotent: bool) -> list[Any]:
        """Send the requests ``build`` starts (in order, pipelined) and return their outcomes.

        Semantic errors are returned in place of the value. An idempotent batch
        is re-sent after a connection problem until ``deadline``.
        """
        losses = self._gate.losses
        while True:
            self.admit(losses, self._gate.wait_connected(losses, deadline))
            try:
                results = build(self.client)
                self._await_last(results, deadline)
                return self.outcomes(results, deadline, losses, idempotent=idempotent)
            except TransientError as exc:
                self.judge_transient(exc, idempotent=idempotent)
                time.sleep(TRANSIENT_PAUSE)
            except ConsensusError:
                raise
            except Exception as exc:  # anything else kazoo raised: never let it escape
                raise ConsensusError(f"ZooKeeper request failed: {type(exc).__name__}: {exc}") from None

    def admit(self, losses: int, connected: bool) -> None:
        """Before a batch is sent: ``SessionLostError`` when the session was closed or lost since the
        call began (``losses`` then), ``OperationTimeoutError`` when no connection came in time."""
        if self._gate.closing:
            raise SessionLostError("the session is closed")
        self._check_session(losses)
        if not connected:
            raise OperationTimeoutError(
                f"no connection to ZooKeeper within {self._settings.request_timeout:g} s "
                f"(session {self.state_name()})"
            )

    def outcomes(
        self, results: Sequence[Any], deadline: float, losses: int, *, idempotent: bool
    ) -> list[Any]:
        """The outcomes of a batch's ``results`` (``TransientError`` for a connection problem); an
        idempotent batch must also have been answered in the session it began in."""
        outcomes = [self._settle(result, deadline) for result in results]
        if idempotent:
            self._check_session(losses)
        self._answered_at = time.monotonic()
        return outcomes

    @staticmethod
    def judge_transient(exc: TransientError, *, idempotent: bool) -> None:
        """After a connection problem: ``OperationTimeoutError`` for a write that may have been
        applied; otherwise the batch is sent again (after ``TRANSIENT_PAUSE``)."""
        if not idempotent and not isinstance(exc.__cause__, kz.ConnectionClosedError):
            raise OperationTimeoutError(
                f"the connection to ZooKeeper broke during a write ({type(exc.__cause__).__name__}); "
                "its effect is unknown"
            ) from None

    @staticmethod
    def _await_last(results: Sequence[Any], deadline: float) -> None:
        """Wait for the last of pipelined requests first: kazoo sets results in the order the server
        answers (the order they were sent), so the others are then set too, and the caller's thread
        wakes once, not once per reply it would otherwise catch before the next arrived."""
        if len(results) > 1:
            results[-1].wait(max(0.0, deadline - time.monotonic()))

    def answered_lately(self) -> bool:
        """Whether a request was answered within the last third of the session timeout. False after a
        quiet spell, such as this process being frozen: its session may have expired meanwhile."""
        return time.monotonic() - self._answered_at < self._settings.session_timeout / 3

    def _check_session(self, losses: int) -> None:
        if self._gate.losses != losses:
            raise SessionLostError("the ZooKeeper session was lost during the call")

    def read(self, build: Build, deadline: float, *, barrier: str | None) -> list[Any]:
        """An idempotent batch; with ``barrier`` a no-op quorum write is sent first.

        ZooKeeper answers a session's requests in order, and a write completes
        only once a quorum committed it, so the reads behind it see every write
        that completed before this call: the reads are linearizable.
        """
        if barrier is None:
            return self.run(build, deadline, idempotent=True)
        return self.run(behind_barrier(build, barrier), deadline, idempotent=True)[1:]

    def _settle(self, result: Any, deadline: float) -> Any:
        try:
            return result.get(timeout=max(0.0, deadline - time.monotonic()))
        except SEMANTIC as exc:
            return exc
        except TRANSIENT as exc:
            raise TransientError() from exc
        except KazooTimeoutError:
            raise OperationTimeoutError(
                f"ZooKeeper did not answer within {self._settings.request_timeout:g} s "
                f"(session {self.state_name()}); the effect of a write is unknown"
            ) from None
        except kz.NoAuthError:  # the ACL does not admit this identity (digest auth: a wrong password too)
            raise PermissionDeniedError(
                f"ZooKeeper refused access (NoAuthError) for {self._url.redacted()}: "
                "check the user name and password in the URL and the ACLs of the chroot"
            ) from None
        except kz.AuthFailedError:
            raise ConfigurationError(
                f"ZooKeeper refused the credentials (AuthFailedError) for {self._url.redacted()}"
            ) from None
        except kz.KazooException as exc:
            raise ConsensusError(f"ZooKeeper request failed: {type(exc).__name__}") from None

    def state_name(self) -> str:
        """kazoo's current connection state, for error messages."""
        return str(self.client.state)
