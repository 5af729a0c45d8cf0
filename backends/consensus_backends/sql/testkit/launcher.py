"""The SQL backend's test servers: PostgreSQL and MariaDB, each with a TLS and password variant, from
Debian's packages."""

from __future__ import annotations

import shutil
from pathlib import Path

from consensus_backends.sql.testkit import mariadb, postgresql
from consensus_testkit.launchers import Launcher
from consensus_testkit.prerequisites import DebianPackage

POSTGRESQL_PACKAGE = DebianPackage(
    what="PostgreSQL",
    packages=("postgresql-15", "postgresql"),  # 15: what the project is tested with
    present=lambda: any(Path("/usr/lib/postgresql").glob("*/bin/postgres")) or bool(shutil.which("postgres")),
)
MARIADB_PACKAGE = DebianPackage(
    what="MariaDB",
    packages=("mariadb-server",),
    present=lambda: bool(shutil.which("mariadbd") or shutil.which("mariadbd", path="/usr/sbin:/usr/bin")),
)

POSTGRESQL = Launcher(
    name="postgresql",
    start=postgresql.start,
    probe=postgresql.probe,
    secure=True,
    needs=(POSTGRESQL_PACKAGE,),
)
MARIADB = Launcher(
    name="mariadb",
    start=mariadb.start,
    probe=mariadb.probe,
    secure=True,
    needs=(MARIADB_PACKAGE,),
)
