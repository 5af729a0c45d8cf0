"""The SQL backend's test servers: PostgreSQL (with a TLS and password variant) and MariaDB."""

from __future__ import annotations

from consensus_backends.sql.testkit import mariadb, postgresql
from consensus_testkit.launchers import Launcher

POSTGRESQL = Launcher(name="postgresql", start=postgresql.start, probe=postgresql.probe, secure=True)
MARIADB = Launcher(name="mariadb", start=mariadb.start, probe=mariadb.probe)
