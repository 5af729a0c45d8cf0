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
    OperationTimeoutError,
    PermissionDeniedError,
)
from consensus_redis.scripts import PRELUDE

DEFAULT_PORT = 6379
#: Seconds between tries of a call that could not be sent.
RETRY_PAUSE = 0.05
#: Replies that say the server did not run the command (it is starting, or busy with a script).
_NOT_RUN = ("LOADING", "BUSY", "TRYAGAIN", "MASTERDOWN")
_NETWORK = (redis.ConnectionError, redis.TimeoutError, OSError)
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
                "connection_class": redis.SSLConnection,
                "ssl_ca_certs": security.tls_ca,
                "ssl_certfile": security.tls_cert,
                "ssl_keyfile": security.tls_key,
                "ssl_password": security.tls_key_password,
                "ssl_cert_reqs": "required",
                "ssl_check_hostname": True,
                "ssl_min_version": ssl.TLSVersion.TLSv1_2,
            }
        self.pool = redis.ConnectionPool(
            host=host,
            port=port,
            username=security.username,
            password=security.password,
            socket_timeout=settings.request_timeout,
            socket_connect_timeout=min(settings.request_timeout, settings.connect_timeout),
            retry=Retry(NoBackoff(), 0),
            health_check_interval=0,
            protocol=2,  # the replies' shapes below are RESP2's
            **_NO_SETINFO,
            **tls,
        )

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
            except (AuthenticationError, AuthorizationError) as exc:
                raise ConfigurationError(
                    f"authentication refused by redis at {self.address}: {exc}"
                ) from None
            except _NETWORK as exc:
                if _tls_refused(exc):
                    raise ConfigurationError(
                        f"TLS with redis at {self.address} failed (certificate or handshake): {exc}"
                    ) from None
                self._pause_or_raise(
                    deadline if retry else 0.0, f"cannot reach redis at {self.address}: {exc}"
                )
                continue
            try:
                connection.send_command(*args)  # type: ignore[no-untyped-call]
                sent = True
                return connection.read_response(timeout=max(deadline - time.monotonic(), 0.01))
            except NoScriptError:
                raise
            except (AuthenticationError, AuthorizationError) as exc:  # NOAUTH, WRONGPASS: not run
                raise ConfigurationError(f"redis at {self.address} refused {args[0]}: {exc}") from None
            except NoPermissionError as exc:  # NOPERM: the ACL user may not run it or touch its keys
                raise PermissionDeniedError(f"redis at {self.address} refused access: {exc}") from None
            except ResponseError as exc:
                if not str(exc).startswith(_NOT_RUN):
                    raise BackendUnavailableError(
                        f"redis at {self.address} refused {args[0]}: {exc}"
                    ) from None
                self._pause_or_raise(
                    deadline if retry else 0.0, f"redis at {self.address} is not ready: {exc}"
                )
            except _NETWORK as exc:
                connection.disconnect()  # type: ignore[no-untyped-call]
                if sent and (write or isinstance(exc, redis.TimeoutError)):
                    raise OperationTimeoutError(
                        f"redis at {self.address} did not answer {args[0]} ({exc}); its effect is unknown"
                    ) from None
                self._pause_or_raise(
                    deadline if retry else 0.0, f"redis at {self.address} did not answer: {exc}"
                )
            except (ValueError, AttributeError):  # redis-py, on a socket ``close`` closed under it
                if not self.closed:
                    raise
                raise BackendUnavailableError(f"the client of redis at {self.address} is closed") from None
            finally:
                self.pool.release(connection)

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
        if not isinstance(reply, list) or not reply:
            raise BackendUnavailableError(f"unexpected reply from a script: {reply!r}")
        return [reply[0].decode(), *reply[1:]]

    def _pause_or_raise(self, deadline: float, reason: str) -> None:
        if time.monotonic() + RETRY_PAUSE >= deadline:
            raise BackendUnavailableError(reason)
        time.sleep(RETRY_PAUSE)


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
