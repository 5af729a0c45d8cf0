"""MySQL and MariaDB engines (PyMySQL), and which of their errors may be retried.

Every connection runs its transactions at ``READ COMMITTED`` (each statement
sees what committed before it, as on PostgreSQL) and starts with session
settings that bound what a stalled client can hold (``session_settings``):
``max_statement_time`` = ``request_timeout`` (MariaDB; MySQL's
``max_execution_time`` covers reads only), ``innodb_lock_wait_timeout`` =
twice the stall limit and, on MariaDB, ``idle_transaction_timeout`` = the
stall limit: the server closes the connection of a client idle inside a
transaction that long (a frozen process), which rolls it back and frees its
locks. MariaDB counts both in whole seconds: the stall limit is rounded down,
to at least 1 s. MySQL has no idle-transaction timeout: a frozen client's
locks stay until ``wait_timeout`` ends its connection.

TLS follows the common security options (``Options.security``): with ``tls``
every connection is TLS, the server's certificate chain and host name checked
against ``tls_ca`` alone (else the system's trust store) before the user name or
anything else is sent, with the client certificate (``tls_cert``, ``tls_key``,
``tls_key_password``) when given; without it no TLS is attempted. The user name
and password are the URL's or the options'.
"""

from __future__ import annotations

import importlib.util
import math
import time
from collections.abc import Callable
from typing import Any

import sqlalchemy
from sqlalchemy import URL, Engine, create_engine, event

from consensus_api.config import BackendURL, Options, Security
from consensus_api.errors import ConfigurationError

#: Lock wait timeout (1205: only the statement was rolled back; we roll back the rest) and deadlock
#: (1213: the transaction was rolled back).
RETRYABLE_ERRORS = {1205, 1213}
DEFAULT_PORT = 3306
#: Seconds past ``request_timeout`` after which a read or write of a connection is given up.
IO_SLACK = 1.0
#: The server status flag "a transaction is open" (``pymysql.constants.SERVER_STATUS``), kept by
#: PyMySQL from every OK packet.
SERVER_STATUS_IN_TRANS = 1

#: The deadline of the current call and the least time a connection may begin with (``client``).
CallBound = Callable[[], "tuple[float, float] | None"]


def create(url: BackendURL, settings: Options, stall: float, call_bound: CallBound) -> Engine:
    """An engine for a ``mysql[+pymysql]://`` or ``mariadb[+pymysql]://`` URL; ``ConfigurationError``
    for one it cannot serve. No I/O."""
    if importlib.util.find_spec("pymysql") is None:
        raise ConfigurationError(
            f"the {url.scheme!r} backend needs PyMySQL, which is not installed: "
            "pip install 'consensus-api[mysql]'"
        )
    database = url.path.strip("/")
    if len(url.endpoints) != 1 or not database:
        raise ConfigurationError(
            f"a {url.scheme} URL needs one host and a database: "
            f"{url.scheme}://user:password@host:{DEFAULT_PORT}/database"
        )
    endpoint = url.endpoints[0]
    family = url.scheme.partition("+")[0]
    # No answer takes longer than max_statement_time = request_timeout: a read or write waiting past
    # this bound is on a broken connection (a stalled network), which the driver then closes.
    io_timeout = settings.request_timeout + IO_SLACK
    connect_args: dict[str, Any] = {
        "connect_timeout": settings.connect_timeout,
        "read_timeout": io_timeout,
        "write_timeout": io_timeout,
        **_tls(settings.security),
    }
    engine = create_engine(
        URL.create(
            f"{family}+pymysql",
            username=settings.security.username,
            password=settings.security.password,
            host=endpoint.host,
            port=endpoint.port or DEFAULT_PORT,
            database=database,
            query={"charset": "utf8mb4"},
        ),
        connect_args=connect_args,
        isolation_level="READ COMMITTED",
        pool_size=8,
        max_overflow=24,
        pool_timeout=settings.request_timeout,
        pool_reset_on_return=None,  # see _end_open_transaction
    )

    @event.listens_for(engine, "reset")
    def _end_open_transaction(dbapi_connection: Any, _record: Any, _state: Any) -> None:
        """Roll back a returned connection's transaction only if the server reports one open.

        PyMySQL sends ROLLBACK whether or not a transaction is open, and every call
        here ends its own transaction; an unconditional ROLLBACK to a paused server
        held a finished call past its deadline (the pool resets on return, in the
        caller's thread).
        """
        if dbapi_connection.server_status & SERVER_STATUS_IN_TRANS:
            dbapi_connection.rollback()

    settings_sql = {
        True: session_settings(settings, stall, True),
        False: session_settings(settings, stall, False),
    }

    @event.listens_for(engine, "connect")
    def _configure(dbapi_connection: Any, _record: Any) -> None:
        mariadb = "mariadb" in dbapi_connection.get_server_info().lower()
        with dbapi_connection.cursor() as cursor:
            cursor.execute(settings_sql[mariadb])

    @event.listens_for(engine, "do_connect")
    def _bounded_connect(dialect: Any, record: Any, cargs: Any, cparams: dict[str, Any]) -> Any:
        """Within a call, the whole connection (TCP, handshake, authentication) ends by its deadline."""
        bound = call_bound()
        if bound is None:
            return None
        import pymysql  # noqa: PLC0415 - only with the mysql extra

        deadline, min_left = bound
        left = deadline - time.monotonic()
        if left < min_left:
            raise pymysql.OperationalError(2003, "no time left to connect within request_timeout")
        during = {"connect_timeout": left, "read_timeout": left, "write_timeout": left}
        connection = pymysql.connect(*cargs, **{**cparams, **during})
        # PyMySQL has no setter; it applies these before each read and write.
        connection._read_timeout = connection._write_timeout = io_timeout  # type: ignore[attr-defined]
        return connection

    return engine


def session_settings(settings: Options, stall: float, mariadb: bool) -> str:
    """The ``SET SESSION`` statement every connection starts with (see the module docstring)."""
    whole_stall = max(1, math.floor(stall))
    values: dict[str, float] = {
        "innodb_lock_wait_timeout": max(1, round(2 * stall)),
        "lock_wait_timeout": max(1, math.ceil(settings.request_timeout)),  # metadata locks (DDL)
    }
    if mariadb:
        values["max_statement_time"] = settings.request_timeout
        values["idle_transaction_timeout"] = whole_stall
    else:
        values["max_execution_time"] = max(1, round(settings.request_timeout * 1000))
    return "SET SESSION " + ", ".join(f"{name} = {value}" for name, value in values.items())


def _tls(security: Security) -> dict[str, object]:
    """PyMySQL's TLS arguments: with ``tls``, ``Security.ssl_context()`` (chain and host name checked,
    the client certificate loaded; an unreadable file or a wrong key password is a
    ``ConfigurationError`` here, before any I/O); without it, TLS disabled (PyMySQL would otherwise
    try TLS without checking the server)."""
    if not security.tls:
        return {"ssl_disabled": True}
    try:
        return {"ssl": security.ssl_context()}
    except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
        raise ConfigurationError(f"the TLS files cannot be used: {exc}") from None


def is_retryable(exc: sqlalchemy.exc.DBAPIError) -> bool:
    """True for a MySQL deadlock or lock wait timeout (``RETRYABLE_ERRORS``); PyMySQL's errors carry
    their number first."""
    args: tuple[Any, ...] = getattr(exc.orig, "args", ())
    return bool(args) and isinstance(args[0], int) and args[0] in RETRYABLE_ERRORS
