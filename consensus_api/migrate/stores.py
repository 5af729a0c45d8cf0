"""The two stores of a bridged migration as the tools (cut-over, roll-back, status) see them."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from consensus_api import config, registry
from consensus_api.errors import (
    ConfigurationError,
    KeyExistsError,
    VersionConflictError,
)
from consensus_api.floor import FLOOR_KEY, MARKER_KEY, FloorBackend, parse_floor
from consensus_api.marker import BRIDGED_GROUP, Marker
from consensus_api.migrate.copying import Migration
from consensus_api.migrate.ledger import reserved
from consensus_api.migrate.source import SessionSource
from consensus_api.session import Session


def check_timeout(timeout: object) -> float:
    """``timeout`` if it is a positive finite number of seconds, else ``ConfigurationError``."""
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout < math.inf:
        raise ConfigurationError(f"timeout must be a positive number of seconds, not {timeout!r}")
    return float(timeout)


class Store:
    """One side of a migration, opened by URL: marker, floor, seal, sessions and announcements."""

    def __init__(self, side: str, url: config.BackendURL, session: Session) -> None:
        self.side = side
        self.url = url
        backend = session._backend  # the SPI calls only the migration's tools make
        assert isinstance(backend, FloorBackend)
        self.backend: FloorBackend = backend

    def marker(self) -> Marker | None:
        """The migration marker on this store, or None."""
        return Marker.decode(self.backend.fetch(MARKER_KEY))

    def write_marker(self, marker: Marker) -> None:
        """Store ``marker`` (replacing what is there)."""
        encoded = marker.encode()
        while True:
            found = self.backend.fetch(MARKER_KEY)
            try:
                if found is None:
                    self.backend.put(MARKER_KEY, encoded, None)
                else:
                    self.backend.update(MARKER_KEY, encoded, found.version, None)
                return
            except (KeyExistsError, VersionConflictError):
                continue

    def floor(self) -> int:
        """The store's term floor."""
        return parse_floor(self.backend.fetch(FLOOR_KEY))

    def announcements(self) -> dict[str, dict[str, Any]]:
        """The members of ``BRIDGED_GROUP``: member id -> announcement (``bridging.announcement``)."""
        found: dict[str, dict[str, Any]] = {}
        for member_id, data in self.backend.membership(BRIDGED_GROUP).items():
            try:
                parsed = json.loads(data)
            except ValueError:
                continue
            if isinstance(parsed, dict):
                found[member_id] = parsed
        return found

    def unbridged(self, own: set[str]) -> list[str] | None:
        """Live sessions on this store that announce no bridge (``own``: the tool's sessions, left
        out), sorted; None where the store cannot list its live sessions."""
        live = self.backend.live_sessions()
        if live is None:
            return None
        announced = {str(entry.get("session")) for entry in self.announcements().values()}
        return sorted(live - announced - own)

    def fingerprint(self) -> str:
        """A digest of every key and version on this store, outside the migration's own keys: it
        changes with every write accepted."""
        pairs = sorted((key, found.version) for key, found in self.backend.walk("") if not reserved(key))
        blob = json.dumps(pairs, separators=(",", ":")).encode("utf-8")
        return hashlib.blake2b(blob, digest_size=16).hexdigest()


@contextmanager
def opened(old: str, new: str, options: Mapping[str, Any] | None) -> Iterator[tuple[Migration, Store, Store]]:
    """A migration between ``old`` and ``new`` and both stores, URLs and options checked before any
    I/O. One session per store: its backend serves the tools too (a second connection to a SQLite
    file in this process would be one more to keep the file's locks consistent with)."""
    for name, value in (("old", old), ("new", new)):
        if not isinstance(value, str):
            raise ConfigurationError(f"the {name} store's URL must be a str, not {type(value).__name__}")
    parsed = [_checked(url, dict(options or {})) for url in (old, new)]
    if parsed[0].unredacted() == parsed[1].unredacted():
        raise ConfigurationError(f"the old and the new store are the same ({parsed[0].redacted()})")
    with Migration(old, new, options=options) as migration:
        source = migration.source
        assert isinstance(source, SessionSource)  # not raw: a session's source
        yield migration, Store("old", parsed[0], source.session), Store("new", parsed[1], migration.target)


def _checked(url: str, options: dict[str, Any]) -> config.BackendURL:
    parsed, query = config.parse_url(url)
    backend_class = registry.load_backend(parsed.scheme)
    config.build_options({**options, **query}, backend_class.options, parsed.scheme, parsed)
    return parsed
