"""Backend registry: URL scheme -> backend class, loaded lazily by entry point or run-time registration.

Backends register in the entry-point group ``consensus_api.backends``; the
entry-point name is the URL scheme and its extras name the distribution extra
that brings the backend's client library, e.g.
``zookeeper = "consensus_backends.zookeeper:ZooKeeperBackend [zookeeper]"``.
``register(scheme, "pkg.module:Class")`` adds one at run time (tests, an
application's own backend). A backend's module is imported only when a URL
with its scheme is opened.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import cache
from importlib.metadata import EntryPoint, entry_points

from consensus_api.backend import Backend
from consensus_api.errors import ConfigurationError

GROUP = "consensus_api.backends"

_SCHEME = re.compile(r"[a-z][a-z0-9+.-]*")
_TARGET = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")

#: Schemes registered at run time; they win over entry points of the same name.
_registered: dict[str, EntryPoint] = {}


@cache
def _entry_points() -> dict[str, EntryPoint]:
    return {ep.name: ep for ep in entry_points(group=GROUP)}


def _backends() -> dict[str, EntryPoint]:
    return {**_entry_points(), **_registered}


def register(scheme: str, target: str) -> None:
    """Serve URLs with ``scheme`` by the ``Backend`` subclass ``target`` (``"pkg.module:Class"``).

    Both are checked at once (``ConfigurationError`` for a scheme a URL cannot
    have or a target not of the form ``module:attribute``); the class is
    imported when a URL with ``scheme`` is first opened and must then be a
    ``Backend`` subclass. A registered scheme replaces an installed entry point
    of the same name, for this process, and registering a scheme again replaces
    the earlier registration: the latest decision of the application wins.
    """
    if not isinstance(scheme, str) or not _SCHEME.fullmatch(scheme):
        raise ConfigurationError(
            f"cannot register the scheme {scheme!r}: expected lower-case letters, digits, '+', '-' or "
            "'.', starting with a letter"
        )
    if not isinstance(target, str) or not _TARGET.fullmatch(target):
        raise ConfigurationError(
            f"cannot register {target!r} for {scheme!r}: expected 'package.module:BackendClass'"
        )
    _registered[scheme] = EntryPoint(name=scheme, value=target, group=GROUP)


def schemes() -> frozenset[str]:
    """Every URL scheme an installed or registered backend serves."""
    return frozenset(_backends())


def load_backend(scheme: str) -> type[Backend]:
    """The backend class for ``scheme``; a missing extra is a ``ConfigurationError``."""
    backend = load_entry(_backends(), scheme, "backend")
    if not (isinstance(backend, type) and issubclass(backend, Backend)):
        raise ConfigurationError(f"{scheme!r} does not name a Backend subclass: {backend!r}")
    return backend


def load_entry(found: Mapping[str, EntryPoint], scheme: str, what: str) -> object:
    """What the entry point named ``scheme`` in ``found`` loads; an unknown scheme (naming the known
    ones) or a missing dependency (naming what to install) is a ``ConfigurationError``."""
    entry = found.get(scheme)
    if entry is None:
        known = ", ".join(sorted(found)) or "none (is consensus-api installed?)"
        raise ConfigurationError(f"no {what} for the URL scheme {scheme!r}; known schemes: {known}")
    try:
        return entry.load()
    except ModuleNotFoundError as exc:
        raise ConfigurationError(
            f"the {scheme!r} {what} needs a package that is not installed ({exc.name or exc}): "
            f"{install_hint(entry)}"
        ) from None
    except AttributeError as exc:
        raise ConfigurationError(f"the {scheme!r} {what} {entry.value!r} does not exist: {exc}") from None


def install_hint(entry: EntryPoint) -> str:
    """What to install for ``entry``: its distribution with the entry point's extras
    (``pip install 'consensus-api[postgresql]'``, ``pip install 'their-dist[extra]'``); for a
    run-time registration, the package of its module."""
    extras = f"[{','.join(entry.extras)}]" if entry.extras else ""
    if entry.dist is not None:
        return f"pip install '{entry.dist.name}{extras}'"
    return f"install the package that provides {entry.module!r}"
