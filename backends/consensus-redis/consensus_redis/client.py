"""Commands and scripts over one redis-py connection pool, with the contract's error semantics.

A call that fails before its command was sent (no connection, a server still
loading its data after a restart) is retried until the call's deadline, then
raises ``BackendUnavailableError``: it was not applied. A call whose command
was sent but whose reply never came by the deadline raises
``OperationTimeoutError`` (for a write: its effect is unknown); a read whose
connection broke is sent again.
redis-py's own retries are off, so nothing is sent twice behind our back.
The password is handed to redis-py only; no message here names it.
"""

from __future__ import annotations

import hashlib
import inspect
import ssl
import time
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.connection import AbstractConnection
from redis.exceptions import (
    AuthenticationError,
    AuthorizationError,
    NoPermissionError,
    NoScriptError,
    ResponseError,
)
from redis.retry import Retry

from consensus_api.config import BackendURL, Endpoint, Options
from consensus_api.errors import (
    BackendUnavailableError,
    ConfigurationError,
    ConsensusError,
    OperationTimeoutError,
    PermissionDeniedError,
)
from consensus_redis.scripts import PRELUDE

DEFAULT_PORT = 6379
#: Seconds between tries of a call that could not be sent.
RETRY_PAUSE = 0.05
#: Replies that say the server did not run the command (it is starting, or busy with a script).
_NOT_RUN = ("LOADING", "BUSY", "TRYAGAIN", "MASTERDOWN")
NETWORK_ERRORS = (redis.ConnectionError, redis.TimeoutError, OSError)
#: No CLIENT SETINFO round trips on connect: a new connection costs nothing before its first command
#: (AUTH only with a password). redis-py >= 7 takes ``driver_info=None``, older ones no lib name.
_NO_SETINFO: dict[str, Any] = (
    {"driver_info": None}
    if "driver_info" in inspect.signature(AbstractConnection.__init__).parameters
    else {"lib_name": None, "lib_version": None}
)


class Script:
    """One Lua script: ``PRELUDE`` plus its body, called by SHA1 (``EVALSHA``), loaded on ``NOSCRIPT``."""

    def __init__(self, body: str) -> None:
        self.source = (PRELUDE + body).encode()
        self.sha = hashlib.sha1(self.source).hexdigest()  # Redis names scripts by SHA1


class RedisClient:
    """A connection pool to one Redis server; thread-safe."""

    def __init__(self, url: BackendURL, settings: Options) -> None:
        endpoint = url.endpoints[0] if url.endpoints else Endpoint("127.0.0.1", DEFAULT_PORT)
        host, port = endpoint.host, endpoint.port or DEFAULT_PORT
        self.address = f"{host}:{port}"
        self.request_timeout = settings.request_timeout
        self.closed = False
        security = settings.security
        tls: dict[str, Any] = {}
        if security.tls:  # chain and host name checked, against tls_ca alone when given
            try:
                security.ssl_context()  # unreadable or bad files: refused here, before any I/O
            except (OSError, ssl.SSLError) as exc:
                raise ConfigurationError(f"cannot use the TLS files for redis: {exc}") from None
            tls = {
                "ssl_ca_certs": security.tls_ca,
                "ssl_certfile": security.tls_cert,
                "ssl_keyfile": security.tls_key,
                "ssl_password": security.tls_key_password,
                "ssl_cert_reqs": "required",
                "ssl_check_hostname": True,
                "ssl_min_version": ssl.TLSVersion.TLSv1_2,
            }
        #: What every connection is made with (also the asyncio storage's, ``consensus_redis.aio``),
        #: but the connection class for TLS and the retry policy, which differ for asyncio.
        self.parameters: dict[str, Any] = {
            "host": host,
            "port": port,
            "username": security.username,
            "password": security.password,
            "socket_timeout": settings.request_timeout,
            "socket_connect_timeout": min(settings.request_timeout, settings.connect_timeout),
            "health_check_interval": 0,
            "protocol": 2,  # the replies' shapes below are RESP2's
            **_NO_SETINFO,
            **tls,
        }
        self.tls = bool(tls)
        connection_class: dict[str, Any] = {"connection_class": redis.SSLConnection} if tls else {}
        self.pool = redis.ConnectionPool(**self.parameters, retry=Retry(NoBackoff(), 0), **connection_class)

    def close(self) -> None:
        """Close every connection of the pool, also those in use: their calls raise
        ``BackendUnavailableError``."""
        self.closed = True
        self.pool.disconnect()

    def deadline(self) -> float:
        """The deadline of a call starting now."""
        return time.monotonic() + self.request_timeout

    def command(
        self, *args: Any, write: bool = False, deadline: float | None = None, retry: bool = True
    ) -> Any:
        """Run one command; see the module docstring for what is retried and raised. Without
        ``retry`` (the heartbeat, a retry loop itself) nothing is tried twice."""
        deadline = deadline if deadline is not None else self.deadline()
        while True:
            if self.closed:  # never reconnect a closed client
                raise BackendUnavailableError(f"the client of redis at {self.address} is closed")
            sent = False
            try:
                connection = self.pool.get_connection()
            except Exception as exc:
                self._retry_or_raise(exc, connect_failure(exc, self.address), deadline if retry else 0.0)
                continue
            try:
                connection.send_command(*args)  # type: ignore[no-untyped-call]
                sent = True
                return connection.read_response(timeout=max(deadline - time.monotonic(), 0.01))
            except Exception as exc:
                if isinstance(exc, NETWORK_ERRORS):
                    connection.disconnect()  # type: ignore[no-untyped-call]
                outcome = command_failure(
                    exc, self.address, args[0], sent=sent, write=write, closed=self.closed
                )
                self._retry_or_raise(exc, outcome, deadline if retry else 0.0)
            finally:
                self.pool.release(connection)

    def _retry_or_raise(self, exc: Exception, outcome: ConsensusError | str | None, deadline: float) -> None:
        """End a failed attempt as ``outcome`` says (``command_failure``): raise it, ``exc`` itself
        (None), or pause before the next attempt (a reason: ``BackendUnavailableError`` with it
        past ``deadline``)."""
        if outcome is None:
            raise exc
        if isinstance(outcome, ConsensusError):
            raise outcome from None
        self._pause_or_raise(deadline, outcome)

    def run(
        self,
        script: Script,
        *args: str | bytes | int,
        write: bool = True,
        deadline: float | None = None,
        retry: bool = True,
    ) -> list[Any]:
        """Run ``script`` with ``args`` as ARGV; its reply (an array, first element decoded)."""
        deadline = deadline if deadline is not None else self.deadline()
        try:
            reply = self.command("EVALSHA", script.sha, 0, *args, write=write, deadline=deadline, retry=retry)
        except NoScriptError:
            reply = self.command("EVAL", script.source, 0, *args, write=write, deadline=deadline, retry=retry)
        return script_reply(reply)

    def _pause_or_raise(self, deadline: float, reason: str) -> None:
        if time.monotonic() + RETRY_PAUSE >= deadline:
            raise BackendUnavailableError(reason)
        time.sleep(RETRY_PAUSE)


def script_reply(reply: Any) -> list[Any]:
    """A script's reply (an array) with its first element (the outcome) decoded."""
    if not isinstance(reply, list) or not reply:
        raise BackendUnavailableError(f"unexpected reply from a script: {reply!r}")
    return [reply[0].decode(), *reply[1:]]


def connect_failure(exc: Exception, address: str) -> ConsensusError | str | None:
    """How a failure to get a connection to redis at ``address`` ends: an error to raise, a reason
    to try again until the deadline, or None (``exc`` itself propagates)."""
    if isinstance(exc, AuthenticationError | AuthorizationError):
        return ConfigurationError(f"authentication refused by redis at {address}: {exc}")
    if not isinstance(exc, NETWORK_ERRORS):
        return None
    if _tls_refused(exc):
        return ConfigurationError(f"TLS with redis at {address} failed (certificate or handshake): {exc}")
    return f"cannot reach redis at {address}: {exc}"


def command_failure(
    exc: Exception, address: str, command: object, *, sent: bool, write: bool, closed: bool
) -> ConsensusError | str | None:
    """How a command (``command``: its name) that raised ``exc`` ends, as ``connect_failure``;
    ``sent``: it reached the socket; ``closed``: the client was closed under it. A ``NOSCRIPT``
    propagates (``run`` loads the script)."""
    if isinstance(exc, NoScriptError):
        return None
    if isinstance(exc, AuthenticationError | AuthorizationError):  # NOAUTH, WRONGPASS: not run
        return ConfigurationError(f"redis at {address} refused {command}: {exc}")
    if isinstance(exc, NoPermissionError):  # NOPERM: the ACL user may not run it or touch its keys
        return PermissionDeniedError(f"redis at {address} refused access: {exc}")
    if isinstance(exc, ResponseError):
        if not str(exc).startswith(_NOT_RUN):
            return BackendUnavailableError(f"redis at {address} refused {command}: {exc}")
        return f"redis at {address} is not ready: {exc}"
    if isinstance(exc, NETWORK_ERRORS):
        if sent and (write or isinstance(exc, redis.TimeoutError)):
            return OperationTimeoutError(
                f"redis at {address} did not answer {command} ({exc}); its effect is unknown"
            )
        return f"redis at {address} did not answer: {exc}"
    if isinstance(exc, ValueError | AttributeError) and closed:  # redis-py, on a socket closed under it
        return BackendUnavailableError(f"the client of redis at {address} is closed")
    return None


def _tls_refused(exc: BaseException) -> bool:
    """A TLS handshake refused a certificate, either way (never retried); a handshake cut short by a
    dying server is not that (retried)."""
    cause = exc.__cause__ or exc.__context__
    text = str(exc)
    return (
        isinstance(cause, ssl.SSLCertVerificationError)
        or "CERTIFICATE_VERIFY_FAILED" in text
        or ("alert" in text and "certificate" in text)
    )
