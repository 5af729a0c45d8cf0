"""The pytest plugin of the conformance suite: the ``--consensus-*`` options and the ``consensus_*`` fixtures.

Opt-in: ``pytest -p consensus_testkit.conformance`` or ``pytest_plugins =
["consensus_testkit.conformance"]`` in a ``conftest.py`` (``consensus conformance``
loads it itself). It adds options and fixtures only; without
``--consensus-url`` (or ``$CONSENSUS_URL``) a test that needs a backend fails
with a message naming the option. A project may override the ``consensus_url``
fixture in its own ``conftest.py``.

Fixtures: ``consensus_url``, ``consensus_options``, ``consensus_profile`` (the
backend's ``TestProfile``), ``consensus_open_session(**options)``,
``consensus_session``, ``consensus_shared_session`` (one per module, for tests
that only validate arguments), ``consensus_ns`` (a unique key namespace per
test), ``consensus_spawn_worker(command, *args, **options)`` (a child process,
see ``worker.py``), ``consensus_server`` (a ``consensus_testkit.ServerHandle``
on the tested server, from the control file ``--consensus-control`` names; on a
cluster a ``ClusterHandle``, whose whole-server faults act on every node),
``consensus_cluster`` (the ``ClusterHandle`` of a cluster's control file) and
``consensus_record`` (a fault test's timings).

Which tests apply is declared by the backend's test profile
(``consensus_testkit.profile``): a test carrying a marker of
``MARKERS`` (``requires_server``, ``database_file``, ``network_namespace``,
``session_expiry``) that the profile declares not applicable is deselected
(never skipped) and listed with the profile's reason. Nothing else deselects a
test: a test that cannot run for another reason - no control file, one that
names another server or port, no network namespaces on this machine - fails
with the reason.
"""

from __future__ import annotations

import json
import os
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import pytest

import consensus_api
from consensus_api.config import ENV_URL, parse_url
from consensus_api.errors import ConfigurationError
from consensus_api.session import Session
from consensus_testkit.cluster import ClusterHandle
from consensus_testkit.conformance.faults_support import Record, TimingLog
from consensus_testkit.conformance.helpers import SessionFactory
from consensus_testkit.conformance.stash import NOT_APPLICABLE
from consensus_testkit.conformance.worker import WorkerProcess
from consensus_testkit.control import attach
from consensus_testkit.netns import why_unavailable
from consensus_testkit.profile import MARKERS, TestProfile, profile_for

if TYPE_CHECKING:
    from consensus_testkit import ServerHandle

URL_OPTION = "--consensus-url"
OPTION_OPTION = "--consensus-option"
CONTROL_OPTION = "--consensus-control"
TIMINGS_OPTION = "--consensus-timings"
CONTROL_ENV = "CONSENSUS_CONTROL"
TIMINGS_ENV = "CONSENSUS_TIMINGS"

TIMINGS = pytest.StashKey[TimingLog]()

#: Options of every session the suite opens, unless the URL's query or --consensus-option sets them.
TEST_DEFAULTS: dict[str, object] = {"session_timeout": 3, "connect_timeout": 10, "request_timeout": 10}

MISSING_URL = (
    f"the consensus-api conformance suite needs a backend URL: pass {URL_OPTION}=URL "
    f"(e.g. {URL_OPTION}=sqlite:////tmp/ct.db) or set ${ENV_URL}"
)


class WorkerFactory(Protocol):
    """``consensus_spawn_worker(command, *args, **options)``: a child worker, killed at teardown."""

    def __call__(self, command: str, *args: str, **options: object) -> WorkerProcess: ...


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("consensus-api", "consensus-api conformance suite")
    group.addoption(
        URL_OPTION,
        dest="consensus_url",
        default=None,
        metavar="URL",
        help=f"backend URL the conformance suite runs against (default: ${ENV_URL})",
    )
    group.addoption(
        OPTION_OPTION,
        dest="consensus_options",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a connection option for every session of the suite (repeatable), e.g. session_timeout=6",
    )
    group.addoption(
        CONTROL_OPTION,
        dest="consensus_control",
        default=None,
        metavar="PATH",
        help=f"control file of the tested server, for the fault tests (default: ${CONTROL_ENV}, "
        "then $CONSENSUS_<SERVER>_CONTROL; `consensus servers run` writes and exports it)",
    )
    group.addoption(
        TIMINGS_OPTION,
        dest="consensus_timings",
        default=None,
        metavar="PATH",
        help=f"write the timings the fault tests measure to PATH as JSON (default: ${TIMINGS_ENV})",
    )


def pytest_configure(config: pytest.Config) -> None:
    for marker, needs in MARKERS.items():
        config.addinivalue_line("markers", f"{marker}: needs {needs}, unless the backend's profile says not")
    path = config.getoption("consensus_timings", None) or os.environ.get(TIMINGS_ENV)
    config.stash[TIMINGS] = TimingLog(Path(path) if path else None)
    config.stash[NOT_APPLICABLE] = {}


def _control_path(config: pytest.Config, server: str) -> str | None:
    path: str | None = (
        config.getoption("consensus_control")
        or os.environ.get(CONTROL_ENV)
        or os.environ.get(f"CONSENSUS_{server.upper()}_CONTROL")
    )
    return path or None


def _control_problem(config: pytest.Config, url: str, profile: TestProfile) -> str | None:
    """Why the fault tests cannot control the server behind ``url``, or None if they can."""
    server = profile.server
    if server is None:
        return f"the {profile.name} backend's test profile names no server"
    path = _control_path(config, server)
    if path is None:
        return (
            f"no control of the {server} server: run under `consensus servers run {server} -- ...` "
            f"or pass {CONTROL_OPTION}=PATH"
        )
    try:
        control = json.loads(Path(path).read_text())
        name, port = control["name"], int(control["port"])
        endpoints = parse_url(url)[0].endpoints
    except (OSError, ValueError, KeyError, TypeError, ConfigurationError) as exc:
        return f"unusable control file {path}: {exc}"
    if name != server:
        return f"the control file {path} is for {name}, the URL for {server}"
    if not any(endpoint.port == port for endpoint in endpoints):
        return f"the control file {path} controls port {port}, which the URL does not name"
    return None


def _markers(item: pytest.Item) -> set[str]:
    return {marker.name for marker in item.iter_markers() if marker.name in MARKERS}


@pytest.hookimpl(trylast=True)  # after -k and -m: only what was selected is counted
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect (never skip) the tests the backend's profile declares not applicable, with the reason."""
    url = _configured_url(config)
    if url is None:
        return  # the tests fail with the missing-URL message
    try:
        profile = profile_for(url)
    except ConfigurationError:
        return  # every test fails with the reason (the consensus_profile fixture)
    reasons = {
        item.nodeid: reason for item in items if (reason := profile.reason_not_applicable(_markers(item)))
    }
    if not reasons:
        return
    config.stash[NOT_APPLICABLE] = reasons
    config.hook.pytest_deselected(items=[item for item in items if item.nodeid in reasons])
    items[:] = [item for item in items if item.nodeid not in reasons]


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A test that applies but whose environment is missing fails with the reason (never skips)."""
    markers = _markers(item)
    url = _configured_url(item.config)
    if "requires_server" in markers and url is not None:
        try:
            problem = _control_problem(item.config, url, profile_for(url))
        except ConfigurationError as exc:
            problem = str(exc)
        if problem is not None:
            pytest.fail(f"this test needs a controlled server: {problem}", pytrace=False)
    if "network_namespace" in markers:
        reason = why_unavailable()
        if reason is not None:
            pytest.fail(f"this test needs network namespaces: {reason}", pytrace=False)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    reasons = config.stash.get(NOT_APPLICABLE, {})
    if reasons:
        terminalreporter.section("consensus-api: tests the backend's profile declares not applicable")
        for reason, count in sorted(Counter(reasons.values()).items()):
            terminalreporter.line(f"{count} test(s) not applicable: {reason}")
    timings = config.stash.get(TIMINGS, None)
    if timings is not None and timings.timings:
        terminalreporter.section("consensus-api: fault timings")
        for line in timings.lines():
            terminalreporter.line(line)


def pytest_unconfigure(config: pytest.Config) -> None:
    timings = config.stash.get(TIMINGS, None)
    if timings is not None:
        timings.write()


def pytest_report_header(config: pytest.Config) -> list[str]:
    url = config.getoption("consensus_url")
    if not url:
        return []
    try:
        shown = parse_url(url)[0].redacted()
    except ConfigurationError:
        shown = "<malformed URL>"
    return [f"consensus-url: {shown}"]


def _configured_url(config: pytest.Config) -> str | None:
    url: str | None = config.getoption("consensus_url", None) or os.environ.get(ENV_URL)
    return url or None


@pytest.fixture(scope="session")
def consensus_url(pytestconfig: pytest.Config) -> str:
    """The backend URL under test, from --consensus-url or $CONSENSUS_URL."""
    url = _configured_url(pytestconfig)
    if url is None:
        pytest.fail(MISSING_URL, pytrace=False)
    return url


@pytest.fixture(scope="session")
def consensus_options(pytestconfig: pytest.Config, consensus_url: str) -> dict[str, object]:
    """Options for every session: the test defaults unless the URL sets them, then --consensus-option."""
    try:
        query = parse_url(consensus_url)[1]
    except ConfigurationError as exc:
        pytest.fail(f"{URL_OPTION}: {exc}", pytrace=False)
    options = {name: value for name, value in TEST_DEFAULTS.items() if name not in query}
    for item in pytestconfig.getoption("consensus_options"):
        name, equals, value = item.partition("=")
        if not equals or not name:
            pytest.fail(f"{OPTION_OPTION} expects NAME=VALUE, got {item!r}", pytrace=False)
        options[name] = value
    return options


@pytest.fixture(scope="session")
def consensus_profile(consensus_url: str) -> TestProfile:
    """The tested backend's test profile (``Backend.test_profile``); fails when it declares none."""
    try:
        return profile_for(consensus_url)
    except ConfigurationError as exc:
        pytest.fail(f"{URL_OPTION}: {exc}", pytrace=False)


@pytest.fixture
def consensus_open_session(
    consensus_url: str, consensus_options: dict[str, object]
) -> Iterator[SessionFactory]:
    """``consensus_open_session(**options)`` opens a session on the tested backend; all are closed at
    teardown."""
    sessions: list[Session] = []

    def factory(**options: Any) -> Session:
        opened = consensus_api.connect(consensus_url, **{**consensus_options, **options})
        sessions.append(opened)
        return opened

    yield factory
    _close_all(sessions)


@pytest.fixture
def consensus_session(consensus_open_session: SessionFactory) -> Session:
    """A session on the tested backend with the suite's defaults."""
    return consensus_open_session()


@pytest.fixture(scope="module")
def consensus_shared_session(consensus_url: str, consensus_options: dict[str, object]) -> Iterator[Session]:
    """One session for a whole module, for tests that only check argument validation."""
    opened = consensus_api.connect(consensus_url, **consensus_options)
    yield opened
    opened.close()


@pytest.fixture
def consensus_ns() -> str:
    """A key namespace no other test uses, so no test depends on (or wipes) shared state."""
    return f"ct/{uuid.uuid4().hex}"


@pytest.fixture
def consensus_spawn_worker(
    consensus_url: str, consensus_options: dict[str, object]
) -> Iterator[WorkerFactory]:
    """``consensus_spawn_worker(command, *args, **options)`` starts a child worker; every one is killed
    at teardown."""
    workers: list[WorkerProcess] = []

    def factory(command: str, *args: str, **options: object) -> WorkerProcess:
        worker = WorkerProcess(consensus_url, command, args, {**consensus_options, **options})
        workers.append(worker)
        return worker

    yield factory
    for worker in workers:
        worker.close()


@pytest.fixture
def consensus_record(
    pytestconfig: pytest.Config, request: pytest.FixtureRequest, consensus_profile: TestProfile
) -> Record:
    """``consensus_record(measure, seconds)``: keep a timing of this test for the summary and the JSON
    file (``--consensus-timings``)."""
    timings = pytestconfig.stash[TIMINGS]

    def record(measure: str, seconds: float, note: str = "") -> None:
        timings.record(consensus_profile.name, request.node.name, measure, seconds, note)

    return record


@pytest.fixture(scope="session")
def consensus_controlled_server(
    pytestconfig: pytest.Config, consensus_url: str, consensus_profile: TestProfile
) -> ServerHandle | ClusterHandle:
    """The tested server, from its control file; fails (never skips) when there is none. For a cluster
    a ``ClusterHandle``: the whole-server faults act on every node."""
    problem = _control_problem(pytestconfig, consensus_url, consensus_profile)
    if problem is not None:
        pytest.fail(f"this test needs a controlled server: {problem}", pytrace=False)
    assert consensus_profile.server is not None
    path = _control_path(pytestconfig, consensus_profile.server)
    assert path is not None
    return attach(Path(path))


@pytest.fixture
def consensus_cluster(
    consensus_profile: TestProfile, consensus_controlled_server: ServerHandle | ClusterHandle
) -> Iterator[ClusterHandle]:
    """The tested cluster (per node: kill, pause, resume, restart, isolate; which node leads); every
    node running, healed and the cluster serving again after the test. Fails when there is none."""
    if not isinstance(consensus_controlled_server, ClusterHandle):
        pytest.fail(
            "this test needs a controlled cluster, the control file is a single server's: run under "
            f"`consensus servers run {consensus_profile.server} --nodes 3 -- ...`",
            pytrace=False,
        )
    yield consensus_controlled_server
    consensus_controlled_server.heal()
    consensus_controlled_server.resume()
    consensus_controlled_server.spawn()
    consensus_controlled_server.wait_ready(90)


@pytest.fixture
def consensus_server(
    consensus_controlled_server: ServerHandle | ClusterHandle,
) -> Iterator[ServerHandle | ClusterHandle]:
    """The tested server (pause, resume, kill, restart); running and ready again after the test."""
    yield consensus_controlled_server
    consensus_controlled_server.resume()
    if consensus_controlled_server.running():
        consensus_controlled_server.wait_ready(60)
    else:
        consensus_controlled_server.restart(90)


def _close_all(sessions: list[Session]) -> None:
    failures: list[BaseException] = []
    for opened in reversed(sessions):
        try:
            opened.close()
        except Exception as exc:
            failures.append(exc)
    if failures:
        raise failures[0]
