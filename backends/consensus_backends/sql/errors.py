"""What the SQL drivers' errors mean: a connection refused for good, a statement refused for lack of
a privilege, a transaction to run again, and a one-line description without SQL text or parameters.
``backend`` maps them to ``consensus_api.errors``; MySQL's own retryable errors are
``mysql.is_retryable``.
"""

from __future__ import annotations

import os
import sqlite3

import sqlalchemy
from sqlalchemy import Engine

from consensus_api.errors import ConfigurationError, PermissionDeniedError
from consensus_backends.sql import mysql

#: Serialization failure, deadlock, lock wait past ``lock_timeout``, and a transaction the server
#: ended because its client stalled inside it: each was rolled back as a whole.
_RETRYABLE_SQLSTATES = {"40001", "40P01", "55P03", "25P03"}

#: Connection failures that happen again on every attempt, by what the server, libpq or PyMySQL says
#: (the first match names the cause).
_PERMANENT_FAILURES = (
    ("password authentication failed", "authentication failed: check the user name and password"),
    ("no password supplied", "authentication failed: the server demands a password"),
    ("no pg_hba.conf entry", "authentication failed: the server admits no such connection (pg_hba.conf)"),
    ("(using password:", "authentication failed: check the user name, password and client certificate"),
    ("insecure transport are prohibited", "TLS: the server admits only TLS connections (set tls=true)"),
    ("does not exist", "the database or role does not exist"),
    ("Unknown database", "the database does not exist"),
    ("certificate has expired", "TLS: the server's certificate has expired"),
    ("mismatch, certificate is not valid for", "TLS: the server's certificate is for another host name"),
    ("certificate verify failed", "TLS: the server's certificate was refused"),
    ("server certificate for", "TLS: the server's certificate is for another host name"),
    ("does not match host name", "TLS: the server's certificate is for another host name"),
    ("server does not support SSL", "TLS: the server does not support TLS"),
    ("SSL is required but the server doesn't support it", "TLS: the server does not support TLS"),
    ("root certificate file", "TLS: the CA file cannot be used"),
)

#: Refusals of a user the server admits, by what it says at connect: PostgreSQL's (CONNECT not
#: granted) and MySQL's 1044 (no privilege on the database).
_CONNECT_DENIALS = ("permission denied", "to database '")
#: A statement refused for lack of a privilege: PostgreSQL's SQLSTATE and MySQL's error numbers
#: (database, table, column, global privilege).
_DENIED_SQLSTATE = "42501"
_DENIED_MYSQL_ERRORS = {1044, 1142, 1143, 1227}


def connect_refusal(exc: sqlalchemy.exc.DBAPIError, url: str) -> ConfigurationError | None:
    """The error for a connection to ``url`` (redacted) refused for good, retrying cannot help, with
    the driver's words: ``PermissionDeniedError`` when the server admits the user but not to this
    database, ``ConfigurationError`` for the rest (credentials, TLS, no such database); None when
    retrying may help."""
    args: tuple[object, ...] = getattr(exc.orig, "args", ())
    text = (
        args[1] if len(args) == 2 and isinstance(args[1], str) else str(exc.orig)
    )  # PyMySQL: (number, text)
    denial = next((marker for marker in _CONNECT_DENIALS if marker in text), None)
    if denial is not None:
        return PermissionDeniedError(
            f"cannot connect to {url}: the user may not use this database ({_line(text, denial)})"
        )
    for marker, cause in _PERMANENT_FAILURES:
        if marker in text:
            return ConfigurationError(f"cannot connect to {url}: {cause} ({_line(text, marker)})")
    return None


def denied(exc: Exception) -> bool:
    """True for a statement the server refused for lack of a privilege (nothing of it was applied);
    ``exc``: a ``DBAPIError`` or the driver's own error."""
    driver = _driver(exc)
    if getattr(driver, "sqlstate", None) == _DENIED_SQLSTATE:
        return True
    args: tuple[object, ...] = getattr(driver, "args", ())
    return bool(args) and args[0] in _DENIED_MYSQL_ERRORS


def _line(text: str, marker: str) -> str:
    return next((line for line in text.splitlines() if marker in line), marker).strip()


def is_retryable(exc: Exception) -> bool:
    """True when the transaction was rolled back as a whole and may run again (``_RETRYABLE_SQLSTATES``,
    ``mysql.RETRYABLE_ERRORS``); ``exc``: a ``DBAPIError`` or psycopg's own error."""
    if not isinstance(exc, sqlalchemy.exc.DBAPIError):
        return getattr(exc, "sqlstate", None) in _RETRYABLE_SQLSTATES
    return getattr(exc.orig, "sqlstate", None) in _RETRYABLE_SQLSTATES or mysql.is_retryable(exc)


def _driver(exc: Exception) -> object:
    """The driver's error behind ``exc`` (``exc`` itself when it is one)."""
    return exc.orig if isinstance(exc, sqlalchemy.exc.DBAPIError) else exc


def describe_error(exc: Exception, engine: Engine) -> str:
    """The driver's one-line message (of the driver's error a ``DBAPIError`` wraps, or of a driver's
    error itself), without SQL text or parameters; for SQLite's "database is locked", with the
    process holding the write lock when the system shows it."""
    driver = _driver(exc)
    text = str(driver).strip().splitlines()
    message = text[0] if text else type(driver).__name__
    if getattr(driver, "sqlite_errorcode", None) == sqlite3.SQLITE_BUSY and engine.url.database:
        holder = sqlite_write_lock_holder(engine.url.database)
        if holder is not None:
            message += f"; its write lock is held by process {holder}"
    return message


#: The byte of the ``-shm`` file SQLite locks for writing in WAL mode (``WAL_WRITE_LOCK``).
WAL_WRITE_LOCK_BYTE = 120


def sqlite_write_lock_holder(database: str) -> int | None:
    """The id of the process holding the write lock of SQLite ``database`` (WAL mode), or None.

    Read from ``/proc/locks`` (Linux; None elsewhere), never by opening the
    ``-shm`` file: closing it would drop this process's own POSIX locks on it.
    """
    try:
        shm = os.stat(f"{database}-shm")
        with open("/proc/locks", encoding="ascii") as table:
            lines = table.read().splitlines()
    except OSError:
        return None
    inode = f"{os.major(shm.st_dev):02x}:{os.minor(shm.st_dev):02x}:{shm.st_ino}"
    for line in lines:
        fields = line.split()
        if len(fields) != 8 or fields[3] != "WRITE" or fields[5] != inode:  # blocked waiters have 9
            continue
        start, end = int(fields[6]), fields[7]
        if start <= WAL_WRITE_LOCK_BYTE and (end == "EOF" or int(end) >= WAL_WRITE_LOCK_BYTE):
            return int(fields[4])
    return None
