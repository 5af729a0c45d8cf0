"""The SQL backend: ``sqlite:///path``, ``postgresql://user@host:port/db``, ``mariadb://user:pw@host:port/db``."""

from consensus_backends.sql.backend import SQLBackend

__all__ = ["SQLBackend"]
