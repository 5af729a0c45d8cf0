"""The pytest plugin of the conformance suite: the ``--consensus-url`` option and the fixtures.

Loaded in every pytest run through the ``pytest11`` entry point, it only adds
options and fixtures; without ``--consensus-url`` (or ``$CONSENSUS_URL``) a
test that needs a backend fails with a message naming the option. A project
may also override the ``consensus_url`` fixture in its own ``conftest.py``.

Fixtures: ``consensus_url``, ``consensus_options``, ``open_session(**options)``,
``session``, ``shared_session`` (one per module, for tests that only validate
arguments), ``ns`` (a unique key namespace per test),
``spawn_worker(command, *args, **options)`` (a child process, see ``worker.py``),
``server`` (a ``consensus_api.testing.ServerHandle`` on the tested server, from
the control file ``--consensus-control`` names) and ``record`` (a fault test's timings).

Which tests apply depends on the backend: a test marked ``requires_server``
needs a server process the suite controls (not SQLite, whose "server" is a
file; and not an external server without a control file); one marked
``database_file`` applies to SQLite only; one marked ``network_namespace``
needs Linux network namespaces (root and iproute2,
``consensus_api.testing.netns``). Tests that do not apply are not
collected (deselected, never skipped) and the run lists them with the reason
("not applicable").
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
from consensus_api.conformance.faults_support import Record, TimingLog
from consensus_api.conformance.helpers import SessionFactory
from consensus_api.conformance.worker import WorkerProcess
from consensus_api.errors import ConfigurationError
from consensus_api.session import Session

if TYPE_CHECKING:
    from consensus_api.testing import ServerHandle

URL_OPTION = "--consensus-url"
OPTION_OPTION = "--consensus-option"
CONTROL_OPTION = "--consensus-control"
TIMINGS_OPTION = "--consensus-timings"
CONTROL_ENV = "CONSENSUS_CONTROL"
TIMINGS_ENV = "CONSENSUS_TIMINGS"

#: Which test server serves a URL scheme (``consensus_api.testing``); SQLite has a file, not a server.
SERVER_OF_SCHEME = {
    "postgresql": "postgresql",
    "postgresql+psycopg": "postgresql",
    "zookeeper": "zookeeper",
    "zk": "zookeeper",
    "etcd": "etcd",
    "kafka": "kafka",
}
FILE_SCHEMES = ("sqlite",)

#: Node ids of the tests that do not apply to the tested backend, and why.
NOT_APPLICABLE = pytest.StashKey[dict[str, str]]()
TIMINGS = pytest.StashKey[TimingLog]()

#: Options of every session the suite opens, unless the URL's query or --consensus-option sets them.
TEST_DEFAULTS: dict[str, object] = {"session_timeout": 3, "connect_timeout": 10, "request_timeout": 10}

MISSING_URL = (
    f"the consensus-api conformance suite needs a backend URL: pass {URL_OPTION}=URL "
    f"(e.g. {URL_OPTION}=sqlite:////tmp/ct.db) or set ${ENV_URL}"
)


class WorkerFactory(Protocol):
    """``spawn_worker(command, *args, **options)``: a child worker, killed at teardown."""

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
    config.addinivalue_line(
        "markers", "requires_server: needs a server process the suite controls (not SQLite, not external)"
    )
    config.addinivalue_line("markers", "database_file: applies to a database file (SQLite) only")
    config.addinivalue_line("markers", "network_namespace: needs Linux network namespaces (root, iproute2)")
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


def _control_problem(config: pytest.Config, url: str) -> str | None:
    """Why the fault tests cannot control the server behind ``url``, or None if they can."""
    scheme = url.partition("://")[0].lower()
    server = SERVER_OF_SCHEME.get(scheme)
    if server is None:
        return f"no test server is known for {scheme}:// URLs"
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


def _namespace_problem() -> str | None:
    """Why tests cannot run clients in network namespaces here, or None if they can."""
    try:
        from consensus_api.testing.netns import why_unavailable  # noqa: PLC0415 - needs the test extra
    except ImportError as exc:
        return f"network namespaces need pip install 'consensus-api[test]' ({exc})"
    reason = why_unavailable()
    return None if reason is None else f"no network namespaces here: {reason}"


def _not_applicable(
    item: pytest.Item, url: str, control_problem: str | None, namespace_problem: str | None
) -> str | None:
    scheme = url.partition("://")[0].lower()
    is_file = scheme in FILE_SCHEMES
    if item.get_closest_marker("database_file") is not None and not is_file:
        return "not applicable: a database-file fault (SQLite only)"
    if item.get_closest_marker("requires_server") is not None:
        if is_file:
            return "not applicable: SQLite has no server process"
        if control_problem is not None:
            return f"not applicable: {control_problem}"
    if item.get_closest_marker("network_namespace") is not None and namespace_problem is not None:
        return f"not applicable: {namespace_problem}"
    return None


@pytest.hookimpl(trylast=True)  # after -k and -m: only what was selected is counted
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect (never skip) the tests that do not apply to the tested backend, with the reason."""
    url = _configured_url(config)
    if url is None:
        return  # the tests fail with the missing-URL message
    needs_control = any(item.get_closest_marker("requires_server") for item in items)
    problem = _control_problem(config, url) if needs_control else None
    needs_namespace = any(item.get_closest_marker("network_namespace") for item in items)
    namespace_problem = _namespace_problem() if needs_namespace else None
    reasons = {
        item.nodeid: reason
        for item in items
        if (reason := _not_applicable(item, url, problem, namespace_problem))
    }
    if not reasons:
        return
    config.stash[NOT_APPLICABLE] = reasons
    config.hook.pytest_deselected(items=[item for item in items if item.nodeid in reasons])
    items[:] = [item for item in items if item.nodeid not in reasons]


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    reasons = config.stash.get(NOT_APPLICABLE, {})
    if reasons:
        terminalreporter.section("consensus-api: tests that do not apply to this backend")
        for reason, count in sorted(Counter(reasons.values()).items()):
            terminalreporter.line(f"{count} test(s) {reason}")
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
    url: str | None = config.getoption("consensus_url") or os.environ.get(ENV_URL)
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


@pytest.fixture
def open_session(consensus_url: str, consensus_options: dict[str, object]) -> Iterator[SessionFactory]:
    """``open_session(**options)`` opens a session on the tested backend; all are closed at teardown."""
    sessions: list[Session] = []

    def factory(**options: Any) -> Session:
        opened = consensus_api.connect(consensus_url, **{**consensus_options, **options})
        sessions.append(opened)
        return opened

    yield factory
    _close_all(sessions)


@pytest.fixture
def session(open_session: SessionFactory) -> Session:
    """A session on the tested backend with the suite's defaults."""
    return open_session()


@pytest.fixture(scope="module")
def shared_session(consensus_url: str, consensus_options: dict[str, object]) -> Iterator[Session]:
    """One session for a whole module, for tests that only check argument validation."""
    opened = consensus_api.connect(consensus_url, **consensus_options)
    yield opened
    opened.close()


@pytest.fixture
def ns() -> str:
    """A key namespace no other test uses, so no test depends on (or wipes) shared state."""
    return f"ct/{uuid.uuid4().hex}"


@pytest.fixture
def spawn_worker(consensus_url: str, consensus_options: dict[str, object]) -> Iterator[WorkerFactory]:
    """``spawn_worker(command, *args, **options)`` starts a child worker; every one is killed at teardown."""
    workers: list[WorkerProcess] = []

    def factory(command: str, *args: str, **options: object) -> WorkerProcess:
        worker = WorkerProcess(consensus_url, command, args, {**consensus_options, **options})
        workers.append(worker)
        return worker

    yield factory
    for worker in workers:
        worker.close()


@pytest.fixture
def record(pytestconfig: pytest.Config, request: pytest.FixtureRequest, consensus_url: str) -> Record:
    """``record(measure, seconds)``: keep a timing of this test for the summary and the JSON file
    (``--consensus-timings``)."""
    scheme = consensus_url.partition("://")[0].lower()
    backend = SERVER_OF_SCHEME.get(scheme, scheme)
    timings = pytestconfig.stash[TIMINGS]

    def record(measure: str, seconds: float, note: str = "") -> None:
        timings.record(backend, request.node.name, measure, seconds, note)

    return record


@pytest.fixture(scope="session")
def controlled_server(pytestconfig: pytest.Config, consensus_url: str) -> ServerHandle:
    """The tested server, from its control file; fails (never skips) when there is none."""
    problem = _control_problem(pytestconfig, consensus_url)
    if problem is not None:
        pytest.fail(f"this test needs a controlled server: {problem}", pytrace=False)
    server = SERVER_OF_SCHEME[consensus_url.partition("://")[0].lower()]
    path = _control_path(pytestconfig, server)
    assert path is not None
    try:
        from consensus_api.testing import ServerHandle  # noqa: PLC0415 - needs the test extra
    except ImportError as exc:
        pytest.fail(f"controlling a server needs pip install 'consensus-api[test]' ({exc})", pytrace=False)
    return ServerHandle.attach(Path(path))


@pytest.fixture
def server(controlled_server: ServerHandle) -> Iterator[ServerHandle]:
    """The tested server (pause, resume, kill, restart); running and ready again after the test."""
    yield controlled_server
    controlled_server.resume()
    if controlled_server.running():
        controlled_server.wait_ready(60)
    else:
        controlled_server.restart(90)


def _close_all(sessions: list[Session]) -> None:
    failures: list[BaseException] = []
    for opened in reversed(sessions):
        try:
            opened.close()
        except Exception as exc:
            failures.append(exc)
    if failures:
        raise failures[0]
