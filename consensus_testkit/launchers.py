"""Launchers: how the test kit starts each kind of real server, found through entry points.

A backend's test-side module (``<backend package>.testkit``) declares one
:class:`Launcher` per server it is tested on and registers it in the
entry-point group ``consensus_testkit.launchers`` under the server's name::

    [project.entry-points."consensus_testkit.launchers"]
    redis = "consensus_redis.testkit.launcher:REDIS"

The built-in backends register theirs the same way; the test kit keeps no table
of server names. A launcher says itself what it offers: a TLS and password
variant (``secure``), a replicated cluster (``cluster``), a cluster that names
the nodes holding a session's roles (``ClusterLauncher.holders``).
``sqlite`` is not a server but a database file (``DatabaseFile``): every
store name is ``sqlite`` or a launcher's name.

Loading a launcher checks that the Python packages of its entry point's extras
are installed and imports its server module: a missing client library or test
dependency is a ``ConfigurationError`` naming what to ``pip install``. What the
server needs on the machine (its binaries, jars, Java) are the launcher's
``needs`` (``consensus_testkit.prerequisites``): one missing is a
``NotInstalledError`` naming ``consensus servers install NAME`` before anything
starts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from importlib.metadata import EntryPoint, PackageNotFoundError, distribution, entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from packaging.requirements import Requirement

from consensus_api.errors import ConfigurationError
from consensus_api.registry import install_hint, load_entry
from consensus_testkit import prerequisites
from consensus_testkit.prerequisites import Prerequisite

if TYPE_CHECKING:
    from consensus_testkit.cluster import ClusterHandle, NodeStatus
    from consensus_testkit.process import ServerHandle

#: The entry-point group of launchers, by server name.
GROUP = "consensus_testkit.launchers"
#: The store that is a database file, not a server (``DatabaseFile``).
SQLITE = "sqlite"
#: In a server's directory: the plain port its readiness probe uses when clients get a TLS port.
PROBE_PORT_FILE = "probe-port"


class StartServer(Protocol):
    """``start(workdir, *, secure=False)``: a ready server in its own directory below ``workdir``."""

    def __call__(self, workdir: Path | None = None, *, secure: bool = False) -> ServerHandle: ...


@dataclass(frozen=True, kw_only=True)
class ClusterLauncher:
    """How a launcher starts a replicated cluster and reads what each node says of itself.

    ``start(workdir, nodes)``: a ready cluster; ``status(port)``: the node's role
    and term; ``serves_session(port, identity)``: whether the node holds the
    client connection of the session ``Backend.fault_identity()`` describes;
    ``holders(port, identity)``: the nodes holding that session's roles
    (``consensus_testkit.cluster.SESSION_ROLES``), for servers whose nodes
    coordinate a session's group or lead its log besides the leader.
    """

    start: Callable[[Path | None, int], ClusterHandle]
    status: Callable[[int], NodeStatus | None]
    serves_session: Callable[[int, Mapping[str, Any]], bool]
    holders: Callable[[int, Mapping[str, Any]], dict[str, int]] | None = None


@dataclass(frozen=True, kw_only=True)
class Launcher:
    """How the test kit starts one kind of server (``consensus servers run NAME``).

    ``start``: a ready server (``ServerHandle``), ``secure=True`` only when
    ``secure`` says the launcher has a TLS and password variant; ``probe(port)``:
    whether the server at ``port`` serves; ``cluster``: set when the launcher
    also starts replicated clusters; ``needs``: what the server needs on the
    machine, which ``consensus servers install NAME`` installs; ``environment(server)``:
    variables ``consensus servers run`` exports to COMMAND besides the server's URL
    and control file (what a client needs to use the server as it runs).
    """

    name: str
    start: StartServer
    probe: Callable[[int], bool]
    secure: bool = False
    cluster: ClusterLauncher | None = None
    needs: tuple[Prerequisite, ...] = ()
    environment: Callable[[ServerHandle], Mapping[str, str]] | None = None


@cache
def _entry_points() -> dict[str, EntryPoint]:
    return {ep.name: ep for ep in entry_points(group=GROUP) if ep.name != SQLITE}


def server_names() -> tuple[str, ...]:
    """The names of every installed launcher's server, sorted."""
    return tuple(sorted(_entry_points()))


#: The entry-point group of test profiles (``consensus_testkit.profile``): a server with a profile
#: is a store the conformance suite certifies; one without (Spark) only serves the tools.
PROFILES_GROUP = "consensus_testkit.profiles"


def store_names() -> tuple[str, ...]:
    """What ``start_store`` starts: ``sqlite`` (a database file) and every launcher's server that is
    a store (it has a test profile by its name), not a tool's server such as Spark."""
    profiles = {ep.name for ep in entry_points(group=PROFILES_GROUP)}
    return (SQLITE, *(name for name in server_names() if name in profiles))


@cache
def launcher(name: str) -> Launcher:
    """The launcher of the server ``name``: ``ConfigurationError`` for an unknown name (naming the
    known ones) or a launcher whose Python packages are not installed (naming what to install)."""
    if name not in _entry_points():
        raise ConfigurationError(f"unknown server {name!r}; known: {', '.join(store_names())}")
    entry = _entry_points()[name]
    missing = _missing_packages(entry)
    if missing:
        raise ConfigurationError(
            f"the {name!r} test server needs {', '.join(missing)}, not installed: {install_hint(entry)}"
        )
    found = load_entry(_entry_points(), name, "test server launcher")
    if not isinstance(found, Launcher):
        raise ConfigurationError(f"the launcher {name!r} is {found!r}, not a consensus_testkit Launcher")
    return found


def _missing_packages(entry: EntryPoint) -> list[str]:
    """The distributions the extras of ``entry`` require that are not installed (a client library the
    server module imports only once a server runs counts too)."""
    if entry.dist is None or not entry.extras:
        return []
    return sorted(_unmet(entry.dist.name, frozenset(entry.extras), set()))


def _unmet(dist_name: str, extras: frozenset[str], seen: set[tuple[str, str]]) -> set[str]:
    """The distributions ``dist_name[extras]`` requires through its extras, recursively, that are not
    installed (``dist_name`` itself when it is not)."""
    try:
        requires = distribution(dist_name).requires or []
    except PackageNotFoundError:
        return {dist_name}
    unmet: set[str] = set()
    for extra in sorted(extras):
        if (dist_name, extra) in seen:
            continue
        seen.add((dist_name, extra))
        for requirement in map(Requirement, requires):
            if requirement.marker is not None and requirement.marker.evaluate({"extra": extra}):
                unmet |= _unmet(requirement.name, frozenset(requirement.extras), seen)
    return unmet


def require_launchers(names: Iterable[str]) -> None:
    """Load the launcher of every server in ``names`` (``sqlite`` needs none) and check what its
    server needs on the machine, so that anything missing is a ``ConfigurationError`` naming it
    before anything starts."""
    for name in names:
        if name != SQLITE:
            prerequisites.check(name, launcher(name).needs)


def secure_names() -> tuple[str, ...]:
    """The servers whose launcher has a TLS and password variant (each launcher is loaded)."""
    return tuple(name for name in server_names() if _loads(name) and launcher(name).secure)


def cluster_names() -> tuple[str, ...]:
    """The servers whose launcher also starts clusters (each launcher is loaded)."""
    return tuple(name for name in server_names() if _loads(name) and launcher(name).cluster is not None)


def _loads(name: str) -> bool:
    try:
        launcher(name)
    except ConfigurationError:
        return False
    return True


def start_server(name: str, workdir: Path | None = None, *, secure: bool = False) -> ServerHandle:
    """Start the named server and wait until it is ready; ``secure``: its TLS and password variant.

    A secure server's URL names its user, password and TLS options; its
    certificates are made at start, in ``<server dir>/certs``
    (``consensus_testkit.certificates``). ``ConfigurationError`` for an unknown
    name, a server without a secure variant or a missing dependency
    (``NotInstalledError`` for what the server needs on the machine);
    RuntimeError, with the tail of the server's log, when it cannot start
    (nothing is left running then).
    """
    found = launcher(name)
    if secure and not found.secure:
        raise ConfigurationError(
            f"no secure variant of {name!r}; secure servers: {', '.join(secure_names()) or 'none'}"
        )
    prerequisites.check(name, found.needs)
    return found.start(workdir, secure=True) if secure else found.start(workdir)


def start_cluster(name: str, nodes: int = 3, workdir: Path | None = None) -> ClusterHandle:
    """Start a replicated cluster of ``nodes`` servers ``name`` and wait until it serves (one leader,
    the others following); see ``consensus_testkit.cluster``.

    ``ConfigurationError`` for a server whose launcher starts no cluster or fewer than 3 (or an even
    number of) nodes, or what the server needs missing; RuntimeError, with the logs' tails, when it
    cannot start.
    """
    found = launcher(name)
    if found.cluster is None:
        raise ConfigurationError(
            f"no cluster launcher for {name!r}; clusters: {', '.join(cluster_names()) or 'none'}"
        )
    if nodes < 3 or nodes % 2 == 0:
        raise ConfigurationError(f"a cluster needs an odd number of nodes, at least 3 (got {nodes})")
    prerequisites.check(name, found.needs)
    cluster = found.cluster
    return cluster.start(workdir, nodes)


def probe_for(name: str, port: int, directory: Path | None = None) -> Callable[[], bool]:
    """The readiness probe of the server ``name`` listening on ``port`` (or on the port its
    directory's ``PROBE_PORT_FILE`` names)."""
    probe = launcher(name).probe
    if directory is not None and (directory / PROBE_PORT_FILE).is_file():
        port = int((directory / PROBE_PORT_FILE).read_text())
    return lambda: probe(port)
