"""SQLAlchemy engines for the SQL backend, and what their errors mean.

SQLite runs in WAL mode with a busy timeout of ``request_timeout``; write
transactions begin with ``BEGIN IMMEDIATE`` so they take the write lock up
front. PostgreSQL gets ``statement_timeout`` = ``request_timeout``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import sqlalchemy
from sqlalchemy import URL, Engine, create_engine, event

from consensus_api.config import BackendURL, Options
from consensus_api.errors import ConfigurationError

_RETRYABLE_SQLSTATES = {"40001", "40P01"}  # serialization failure, deadlock


def create(url: BackendURL, settings: Options) -> Engine:
    """An engine for ``url``; ``ConfigurationError`` for a URL it cannot serve. No I/O."""
    if url.scheme == "sqlite":
        return _sqlite(url, settings)
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
    if any(name in settings.extra for name in ("tls", "tls_ca", "tls_cert", "tls_key")):
        raise ConfigurationError("TLS options do not apply to sqlite")
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

    @event.listens_for(engine, "begin")
    def _begin(conn: sqlalchemy.Connection) -> None:
        immediate = conn.get_execution_options().get("consensus_write", False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    return engine


def _postgresql(url: BackendURL, settings: Options) -> Engine:
    if not url.endpoints:
        raise ConfigurationError("a postgresql URL needs a host: postgresql://user@host:5432/database")
    database = url.path.lstrip("/") or "postgres"
    hosts = [f"{e.host}:{e.port or 5432}" for e in url.endpoints]
    query: dict[str, str | list[str]] = {"host": hosts} if len(hosts) > 1 else {}
    extra = settings.extra
    if "tls_ca" in extra or "tls_cert" in extra or extra.get("tls"):
        query["sslmode"] = "verify-full" if "tls_ca" in extra else "require"
    for option, parameter in (("tls_ca", "sslrootcert"), ("tls_cert", "sslcert"), ("tls_key", "sslkey")):
        if option in extra:
            query[parameter] = str(extra[option])
    return create_engine(
        URL.create(
            "postgresql+psycopg",
            username=url.username,
            password=url.password,
            host=None if len(hosts) > 1 else url.endpoints[0].host,
            port=None if len(hosts) > 1 else url.endpoints[0].port,
            database=database,
            query=query,
        ),
        connect_args={
            "connect_timeout": max(1, round(settings.connect_timeout)),
            "options": f"-c statement_timeout={round(settings.request_timeout * 1000)}",
        },
        pool_size=8,
        max_overflow=24,
        pool_timeout=settings.request_timeout,
        pool_pre_ping=True,
    )


def is_retryable(exc: sqlalchemy.exc.DBAPIError) -> bool:
    """True when the transaction was rolled back and may be run again (deadlock, serialization)."""
    return getattr(exc.orig, "sqlstate", None) in _RETRYABLE_SQLSTATES


def describe_error(exc: sqlalchemy.exc.DBAPIError) -> str:
    """The driver's one-line message, without SQL text or parameters."""
    text = str(exc.orig).strip().splitlines()
    return text[0] if text else type(exc.orig).__name__
