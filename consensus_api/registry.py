"""Backend registry: URL scheme -> backend class, loaded lazily by entry point.

Backends register in the entry-point group ``consensus_api.backends``; the
entry-point name is the URL scheme and its extras name the distribution extra
that brings the backend's client library, e.g.
``zookeeper = "consensus_backends.zookeeper:ZooKeeperBackend [zookeeper]"``.
A backend's module is imported only when a URL with its scheme is opened.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from importlib.metadata import EntryPoint, entry_points

from consensus_api.backend import Backend
from consensus_api.errors import ConfigurationError

GROUP = "consensus_api.backends"


@cache
def _entry_points() -> dict[str, EntryPoint]:
    return {ep.name: ep for ep in entry_points(group=GROUP)}


def schemes() -> frozenset[str]:
    """Every URL scheme an installed backend registered."""
    return frozenset(_entry_points())


def load_backend(scheme: str) -> type[Backend]:
    """The backend class for ``scheme``; a missing extra is a ``ConfigurationError``."""
    backend = load_entry(_entry_points(), scheme, "backend")
    if not (isinstance(backend, type) and issubclass(backend, Backend)):
        raise ConfigurationError(f"entry point {scheme!r} does not name a Backend subclass")
    return backend


def load_entry(found: Mapping[str, EntryPoint], scheme: str, what: str) -> object:
    """What the entry point named ``scheme`` in ``found`` loads; an unknown scheme (naming the known
    ones) or a missing extra (naming the extra to install) is a ``ConfigurationError``."""
    entry = found.get(scheme)
    if entry is None:
        known = ", ".join(sorted(found)) or "none (is consensus-api installed?)"
        raise ConfigurationError(f"no {what} for the URL scheme {scheme!r}; known schemes: {known}")
    try:
        return entry.load()
    except ImportError as exc:
        extra = entry.extras[0] if entry.extras else scheme
        raise ConfigurationError(
            f"the {scheme!r} {what} needs a package that is not installed ({exc.name or exc}): "
            f"pip install 'consensus-api[{extra}]'"
        ) from None
