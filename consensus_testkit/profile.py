"""A backend's test profile: what the conformance suite needs to know to test it, declared by the backend.

Every backend declares its profile in its test-side module and registers it,
per URL scheme, in the entry-point group ``consensus_testkit.profiles``
(``mystore = "mystore.testkit.profile:PROFILE"``); the suite (``consensus_testkit.conformance``), the
fault tools (``consensus_testkit.faults``), ``consensus servers`` and
``consensus chaos`` read nothing per backend but this. A minimal profile::

    from consensus_testkit.profile import TestProfile, moved_to_free_port

    PROFILE = TestProfile(
        name="mystore",
        server="mystore",  # a registered launcher's name (consensus_testkit.launchers); None: no server
        detection_delay=lambda session_timeout: 1.0,
        expire_session=expire_on_server,  # (url, Backend.fault_identity(), timeout) -> None
        unreachable_url=moved_to_free_port,
        not_applicable={"database_file": "mystore is a server, not a database file"},
    )

Tests that need something only some backends have carry a marker (``MARKERS``);
a test runs unless the profile declares one of its markers not applicable, with
the reason. Nothing else makes a test "not applicable": a test that cannot run
for any other reason (no server control file, no network namespace) fails.
Nothing here imports pytest or a backend.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import cache
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any

from consensus_api.config import BackendURL, Endpoint, parse_url
from consensus_api.errors import ConfigurationError
from consensus_api.registry import load_entry
from consensus_testkit.launchers import launcher, server_names

#: What a test marked with each marker needs; a profile may declare any of them not applicable.
MARKERS: Mapping[str, str] = {
    "requires_server": "a server process the suite controls (kill, pause, restart, proxy)",
    "database_file": "a database file other processes lock and write (SQLite)",
    "network_namespace": "clients in Linux network namespaces cut off from the server",
    "session_expiry": "ending a session from the server side (TestProfile.expire_session)",
    "secured_server": "a server with TLS and passwords (`consensus servers run NAME --secure`)",
    "freezes_a_writer": "a client frozen (SIGSTOP) at any moment, even inside a write, while others write on",
    "cluster": "a replicated cluster the suite controls per node (`consensus servers run NAME --nodes 3`)",
    "session_roles": "a cluster whose nodes coordinate a session's group or lead its log besides the leader",
    "lists_sessions": "a store that lists its live sessions (Backend.live_sessions: a cut-over checks them)",
}

#: Why ``cluster`` tests do not apply to a URL naming fewer than two servers (``profile_for``).
SINGLE_SERVER = "the URL names a single server; cluster tests run on `consensus servers run NAME --nodes 3`"

#: Why ``secured_server`` tests do not apply to a URL without TLS (``profile_for``).
PLAIN_SERVER = (
    "the URL names a plain server (no tls_ca): the security section runs on "
    "`consensus servers run NAME --secure -- consensus conformance '$CONSENSUS_URL'`"
)

#: ``expire_session(url, identity, timeout)``: end the session ``identity`` names on the server at ``url``.
SessionExpirer = Callable[[BackendURL, Mapping[str, Any], float], None]


@dataclass(frozen=True, kw_only=True)
class TestProfile:
    """How the conformance suite tests one backend (for one URL scheme).

    ``name``: the backend's name in reports and timings (``Session.backend``).
    ``server``: the name of the launcher (``consensus_testkit.launchers``) that
    starts its server (``consensus servers run NAME``); the control file the
    fault tests read must be for it. None when the backend has no server process
    (or none a launcher starts): then ``requires_server`` must be declared not
    applicable.
    ``detection_delay(session_timeout)``: seconds the backend may add to
    ``session_timeout`` before others see a dead session's members and
    candidacies gone (the fault tests allow this plus scheduling slack).
    ``expire_session``: ends a session on the server as a real expiry would,
    given what ``Backend.fault_identity()`` returned; never through the
    session's own client. None only with ``session_expiry`` not applicable.
    ``unreachable_url(url, workdir)``: the tested URL moved to a place nothing
    serves, keeping scheme and path (``workdir`` is an empty scratch directory).
    ``not_applicable``: marker (``MARKERS``) -> why tests with it do not apply.
    ``cluster`` need not be declared: ``profile_for`` declares it for a server
    whose launcher starts no cluster (``Launcher.cluster``) and for
    a URL naming a single server.
    ``credentials_in_url``: its URLs may carry a user name and password (False:
    such a URL is a ``ConfigurationError``, as SQLite's file URLs are).
    ``stop_inside_write(key)``: test kit code the frozen-leader tests' worker
    calls in its own process before a fenced write of ``key``
    (``conformance/worker.py``); it arranges, from outside the backend's code,
    that the process stops itself (SIGSTOP) inside that write's transaction,
    after its statements and before its commit, holding its locks. None: the
    worker stops the process while the write's request is in flight.
    ``restart_delay``: seconds a cluster node of this backend may take, once
    started again after a SIGKILL, beyond what a ZooKeeper or etcd node takes to
    vote and serve (a JVM's start, a broker's re-registration). The quorum-loss
    test adds it to its session's timeout: the guarantee is that a session
    survives a quorum loss the cluster recovers from within session_timeout,
    and the test checks that premise too.
    """

    __test__ = False  # not a pytest test class despite its name

    name: str
    server: str | None
    detection_delay: Callable[[float], float]
    expire_session: SessionExpirer | None
    unreachable_url: Callable[[BackendURL, Path], BackendURL]
    not_applicable: Mapping[str, str] = field(default_factory=dict)
    credentials_in_url: bool = True
    stop_inside_write: Callable[[str], None] | None = None
    restart_delay: float = 0.0

    def __post_init__(self) -> None:
        unknown = set(self.not_applicable) - set(MARKERS)
        if unknown:
            raise ConfigurationError(
                f"test profile {self.name!r} declares unknown markers not applicable: {sorted(unknown)}; "
                f"known: {', '.join(MARKERS)}"
            )
        if self.server is not None and self.server not in server_names():
            raise ConfigurationError(
                f"test profile {self.name!r} names the server {self.server!r}, which no launcher starts; "
                f"known: {', '.join(server_names())}"
            )
        if self.server is None and "requires_server" not in self.not_applicable:
            raise ConfigurationError(
                f"test profile {self.name!r} has no server: declare 'requires_server' not applicable, "
                "with the reason"
            )
        if self.expire_session is None and "session_expiry" not in self.not_applicable:
            raise ConfigurationError(
                f"test profile {self.name!r} has no expire_session: declare 'session_expiry' not "
                "applicable, with the reason"
            )

    def reason_not_applicable(self, markers: set[str]) -> str | None:
        """Why a test with ``markers`` does not apply to this backend, or None if it does."""
        return next((self.not_applicable[m] for m in sorted(markers) if m in self.not_applicable), None)


#: The entry-point group of test profiles, by URL scheme.
GROUP = "consensus_testkit.profiles"


@cache
def _entry_points() -> dict[str, EntryPoint]:
    return {ep.name: ep for ep in entry_points(group=GROUP)}


def profile_for(url: str | BackendURL) -> TestProfile:
    """The test profile registered for ``url``'s scheme (entry-point group ``consensus_testkit.profiles``).

    ``ConfigurationError`` for a scheme no profile is registered for, or a
    missing dependency (never a fallback). Unless the profile declares
    ``cluster`` itself, its tests are declared not applicable when its
    server's launcher starts no cluster, or the URL names fewer than two
    servers (``SINGLE_SERVER``); ``session_roles`` likewise when its cluster
    launcher names no session's role holders; ``secured_server`` when the URL
    given as text names no ``tls_ca`` (``PLAIN_SERVER``).
    """
    parsed, query = parse_url(url) if isinstance(url, str) else (url, {})
    profile = load_entry(_entry_points(), parsed.scheme, "test profile")
    if not isinstance(profile, TestProfile):
        raise ConfigurationError(f"the {parsed.scheme!r} test profile is {profile!r}, not a TestProfile")
    cluster = launcher(profile.server).cluster if profile.server is not None else None
    if "cluster" not in profile.not_applicable:
        reason = SINGLE_SERVER if len(parsed.endpoints) < 2 else None
        if cluster is None:
            reason = f"no launcher starts a cluster of {profile.server or profile.name} servers"
        if reason is not None:
            profile = replace(profile, not_applicable={**profile.not_applicable, "cluster": reason})
    if "secured_server" not in profile.not_applicable and "tls_ca" not in query:
        profile = replace(profile, not_applicable={**profile.not_applicable, "secured_server": PLAIN_SERVER})
    if "session_roles" not in profile.not_applicable and (cluster is None or cluster.holders is None):
        reason = f"no node of a {profile.server or profile.name} cluster holds a role for one session"
        profile = replace(profile, not_applicable={**profile.not_applicable, "session_roles": reason})
    return profile


def moved_to_free_port(url: BackendURL, workdir: Path) -> BackendURL:
    """``url`` with a single endpoint: a loopback port nothing listens on (for server backends; an
    ``unreachable_url`` that needs no ``workdir``)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return replace(url, endpoints=(Endpoint("127.0.0.1", port),))
