"""SQLAlchemy engines for the SQL backend: how each dialect connects, and every call bounded in time.

SQLite runs in WAL mode with a busy timeout of ``request_timeout``; write
transactions begin with ``BEGIN IMMEDIATE`` so they take the write lock up
front. PostgreSQL gets ``statement_timeout`` = ``request_timeout``; a
transaction whose client stalls inside it (a frozen process) is ended by the
server after ``stall_limit`` (``idle_in_transaction_session_timeout``), which
releases its locks, and no lock is waited for longer than twice that
(``lock_timeout``; ``lock_not_available`` is retried). It also gets two
client-side bounds, because a paused server or a network that stopped
delivering answers nothing while TCP keeps the connection up (so neither
``statement_timeout`` nor TCP can end the wait): a new connection gets at
most the time its call has left (``calls_until``), and the ``Watchdog``
(``watchdog``) cuts the socket of a call that outlives its deadline, so the
driver fails at once. A connection a backend holds outside the pool (the LISTEN
connection, PostgreSQL's re-reads) is opened by ``own_connection`` with the
pool's parameters.
MySQL/MariaDB (PyMySQL) get the same bounds with their own settings
(``mysql.session_settings``) and the same ``Watchdog``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import sqlalchemy
from sqlalchemy import URL, Engine, create_engine, event

from consensus_api.config import BackendURL, Options
from consensus_api.errors import ConfigurationError
from consensus_backends.sql import mysql
from consensus_backends.sql.dialect import MYSQL_DIALECTS


def create(url: BackendURL, settings: Options) -> Engine:
    """An engine for ``url``; ``ConfigurationError`` for a URL it cannot serve. No I/O."""
    if url.scheme == "sqlite":
        return _sqlite(url, settings)
    if url.scheme.partition("+")[0] in MYSQL_DIALECTS:
        return mysql.create(
            url, settings, stall_limit(settings), lambda: getattr(_call_deadline, "value", None)
        )
    return _postgresql(url, settings)


def _sqlite(url: BackendURL, settings: Options) -> Engine:
    if url.endpoints or url.username is not None:
        raise ConfigurationError(
            "a sqlite URL has no host: use sqlite:///relative.db or sqlite:////abs/path.db"
        )
    path = url.path[1:]
    if not path or path == ":memory:" or path.startswith("file:"):
        raise ConfigurationError(
            "the sqlite backend needs a database file shared by every session, "
            "e.g. sqlite:///consensus.db; in-memory databases are not supported"
        )
    if settings.security.tls or settings.security.has_credentials:
        raise ConfigurationError("TLS and credential options do not apply to sqlite")
    engine = create_engine(
        URL.create("sqlite", database=str(Path(path))),
        connect_args={
            "timeout": settings.request_timeout,
            "check_same_thread": False,
            "isolation_level": None,
        },
        pool_size=8,
        max_overflow=24,
        pool_timeout=settings.request_timeout,
    )

    @event.listens_for(engine, "connect")
    def _configure(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    return engine


def begin_sqlite(conn: sqlalchemy.Connection, write: bool) -> None:
    """Begin SQLite's transaction in the one SQLAlchemy has just begun on ``conn`` (no-op elsewhere).

    A write takes the write lock up front (``BEGIN IMMEDIATE``), so it never
    fails to upgrade a read lock midway; a read sees one snapshot throughout.
    SQLAlchemy does not begin it itself: the driver runs in autocommit mode.
    """
    if conn.dialect.name == "sqlite":
        conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")


_call_deadline = threading.local()

#: A connection is not begun with less time than this left before its call's deadline.
MIN_CONNECT_LEFT = 0.01
#: What PostgreSQL shows for our connections (``pg_stat_activity.application_name``).
APPLICATION_NAME = "consensus-api"
#: libpq's shortest connect_timeout (1 means 2).
LIBPQ_MIN_CONNECT = 2


@contextlib.contextmanager
def calls_until(deadline: float, min_left: float = MIN_CONNECT_LEFT) -> Iterator[None]:
    """Connections opened by this thread meanwhile give up by ``deadline`` (PostgreSQL).

    None is begun with less than ``min_left`` seconds left. libpq counts its
    ``connect_timeout`` in whole seconds (at least 2), so the connection is made
    on a helper thread and abandoned (closed when it completes) at ``deadline``.
    """
    previous = getattr(_call_deadline, "value", None)
    _call_deadline.value = (deadline, min_left)
    try:
        yield
    finally:
        _call_deadline.value = previous


def own_connection(engine: Engine, deadline: float | None = None) -> Any:
    """A PostgreSQL connection of ``engine`` outside its pool, in autocommit, for the caller to close.

    Opened by the pool's own path, so with every parameter the pool's
    connections get (TLS verification, client certificate, server options,
    ``connect_timeout``), and given up by ``deadline`` where one is given
    (``calls_until``). Errors as the pool's: SQLAlchemy's ``DBAPIError``.
    """
    with calls_until(deadline) if deadline is not None else contextlib.nullcontext():
        pooled = engine.raw_connection()
    connection: Any = pooled.driver_connection
    pooled.detach()  # closed by its holder, never handed back to the pool
    connection.rollback()  # ends what the dialect's first-connect queries began: idle, no round trip
    connection.autocommit = True
    return connection


def _require_psycopg() -> None:
    """``ConfigurationError`` naming the extra when psycopg is missing (SQLAlchemy would raise a bare
    ``ModuleNotFoundError`` from ``create_engine``)."""
    if importlib.util.find_spec("psycopg") is None:
        raise ConfigurationError(
            "the 'postgresql' backend needs psycopg, which is not installed: "
            "pip install 'consensus-api[postgresql]'"
        )


def stall_limit(settings: Options) -> float:
    """Seconds a PostgreSQL transaction may sit idle before the server ends it (rolled back, locks freed).

    A third of the shorter of ``session_timeout`` and ``request_timeout``: our
    transactions never wait on anything but their own statements, so only a
    stalled client (SIGSTOP, a VM or GC pause) comes near it; its locks are then
    free before its lease can lapse (renewed every ``session_timeout / 3``), so
    reaping it and electing the next leader never wait for them, and a call
    queued behind them still completes within its ``request_timeout``.
    """
    return min(settings.session_timeout, settings.request_timeout) / 3


def _server_options(settings: Options) -> str:
    """The ``-c`` settings every PostgreSQL connection starts with, in ms (at least 1: 0 disables)."""
    stall = stall_limit(settings)
    values = {
        "statement_timeout": settings.request_timeout,
        "idle_in_transaction_session_timeout": stall,
        "lock_timeout": 2 * stall,
    }
    return " ".join(f"-c {name}={max(1, round(seconds * 1000))}" for name, seconds in values.items())


def _tls_parameters(settings: Options) -> dict[str, str]:
    """libpq's TLS parameters: the server is always verified (``verify-full``) when TLS is on."""
    security = settings.security
    if not security.tls:
        return {}
    if security.tls_key_password is not None:
        raise ConfigurationError("PostgreSQL (libpq) cannot use an encrypted tls_key: give it unencrypted")
    roots = (
        security.tls_ca
        or ssl.get_default_verify_paths().cafile
        or ssl.get_default_verify_paths().openssl_cafile
    )
    parameters = {"sslmode": "verify-full", "sslrootcert": roots}
    if security.tls_cert is not None and security.tls_key is not None:
        parameters.update(sslcert=security.tls_cert, sslkey=security.tls_key)
    return parameters


def postgresql_parameters(settings: Options) -> dict[str, Any]:
    """The libpq parameters of every PostgreSQL connection beyond the URL's (also the asyncio
    storage's, ``sql.aio``): connect timeout, server settings, application name, TLS."""
    return {
        "connect_timeout": max(LIBPQ_MIN_CONNECT, math.ceil(settings.connect_timeout)),
        "options": _server_options(settings),
        "application_name": APPLICATION_NAME,
        # Without TLS, no silent TLS attempt followed by a second, plain login (libpq's "prefer").
        "sslmode": "disable",
        **_tls_parameters(settings),
    }


def _postgresql(url: BackendURL, settings: Options) -> Engine:
    _require_psycopg()
    if not url.endpoints:
        raise ConfigurationError("a postgresql URL needs a host: postgresql://user@host:5432/database")
    database = url.path.lstrip("/") or "postgres"
    hosts = [f"{e.host}:{e.port or 5432}" for e in url.endpoints]
    query: dict[str, str | list[str]] = {"host": hosts} if len(hosts) > 1 else {}
    engine = create_engine(
        URL.create(
            "postgresql+psycopg",
            username=settings.security.username,
            password=settings.security.password,
            host=None if len(hosts) > 1 else url.endpoints[0].host,
            port=None if len(hosts) > 1 else url.endpoints[0].port,
            database=database,
            query=query,
        ),
        connect_args=postgresql_parameters(settings),
        pool_size=8,
        max_overflow=24,
        pool_timeout=settings.request_timeout,
    )

    @event.listens_for(engine, "do_connect")
    def _bounded_connect(dialect: Any, record: Any, cargs: Any, cparams: dict[str, Any]) -> Any:
        bound: tuple[float, float] | None = getattr(_call_deadline, "value", None)
        if bound is None:
            return None
        deadline, min_left = bound
        left = deadline - time.monotonic()
        if left < min_left:
            import psycopg  # noqa: PLC0415 - the postgresql extra, absent for other schemes

            raise psycopg.OperationalError("no time left to connect within request_timeout")
        cparams["connect_timeout"] = max(LIBPQ_MIN_CONNECT, math.ceil(left))
        return _connect_within(lambda: dialect.connect(*cargs, **cparams), left)

    return engine


def _connect_within(connect: Any, seconds: float) -> Any:
    """``connect()`` on a helper thread; its connection, its error, or after ``seconds`` an
    ``OperationalError`` (the attempt goes on and its connection is closed when it completes)."""
    import psycopg  # noqa: PLC0415 - the postgresql extra, absent for other schemes

    lock = threading.Lock()
    done = threading.Event()
    outcome: dict[str, Any] = {}

    def attempt() -> None:
        try:
            result = connect()
        except BaseException as exc:  # handed to the caller
            result, outcome["error"] = None, exc
        with lock:
            abandoned = outcome.get("abandoned", False)
            outcome["connection"] = result
            done.set()
        if abandoned and result is not None:
            result.close()

    threading.Thread(target=attempt, name="consensus-sql-connect", daemon=True).start()
    done.wait(seconds)
    with lock:
        if not done.is_set():
            outcome["abandoned"] = True
            raise psycopg.OperationalError(f"connection timeout expired ({seconds:.2g} s)")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["connection"]
