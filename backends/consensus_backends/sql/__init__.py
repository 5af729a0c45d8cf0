"""The SQL backend: ``sqlite:///path`` and ``postgresql://user@host:port/db``."""

from consensus_backends.sql.backend import SQLBackend

__all__ = ["SQLBackend"]
