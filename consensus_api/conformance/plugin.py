"""The pytest plugin of the conformance suite: the ``--consensus-url`` option and the fixtures.

Loaded in every pytest run through the ``pytest11`` entry point, it only adds
options and fixtures; without ``--consensus-url`` (or ``$CONSENSUS_URL``) a
test that needs a backend fails with a message naming the option. A project
may also override the ``consensus_url`` fixture in its own ``conftest.py``.

Fixtures: ``consensus_url``, ``consensus_options``, ``open_session(**options)``,
``session``, ``shared_session`` (one per module, for tests that only validate
arguments), ``ns`` (a unique key namespace per test) and
``spawn_worker(command, *args, **options)`` (a child process, see ``worker.py``).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any, Protocol

import pytest

import consensus_api
from consensus_api.config import ENV_URL, parse_url
from consensus_api.conformance.helpers import SessionFactory
from consensus_api.conformance.worker import WorkerProcess
from consensus_api.errors import ConfigurationError
from consensus_api.session import Session

URL_OPTION = "--consensus-url"
OPTION_OPTION = "--consensus-option"

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


def _close_all(sessions: list[Session]) -> None:
    failures: list[BaseException] = []
    for opened in reversed(sessions):
        try:
            opened.close()
        except Exception as exc:
            failures.append(exc)
    if failures:
        raise failures[0]
