"""Security: TLS and passwords against a secured server.

Contract: sections 2 and 10 of <https://consensus-api.github.io/consensus-api/spec/>

Runs against a URL that names a user, a password and TLS with a ``tls_ca``
whose directory also holds the bad certificates of
``consensus_testkit.certificates`` (``consensus servers run NAME --secure``
makes one): the contract works over TLS with authentication (the other sections
run over it too), with the credentials in the URL or given as options; a wrong
password, an unknown CA, a certificate for another host name and an expired one
each fail at connect with a ``ConsensusError`` that names the cause, within
``connect_timeout`` (a refused password at once: never retried); the server
refuses the user the prefix ``/elsewhere`` (``PermissionDeniedError``) while the
same calls succeed in its own; and the password shows up in no exception, log
record (DEBUG included), repr, CLI output or child command line. Against a URL
without TLS and a password, every test fails saying so.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import psutil
import pytest

import consensus_api
from consensus_api import ConsensusError
from consensus_api.config import BackendURL, parse_url
from consensus_testkit.certificates import Impostor

pytestmark = pytest.mark.secured_server

#: A refused login or certificate ends connect within this many seconds (no retries until the deadline).
REFUSAL_BOUND = 2.0
#: The connect_timeout of the refused connects; well above REFUSAL_BOUND, so a retry loop would show.
CONNECT_TIMEOUT = 8.0
#: What a certificate refusal's message may say, on any backend.
CERTIFICATE_WORDS = ("certificate", "TLS", "CERTIFICATE")


@pytest.fixture(scope="module")
def secured(consensus_url: str) -> tuple[BackendURL, dict[str, str], Path]:
    """The tested URL parsed, its options and the directory of its certificates; fails on a plain URL."""
    parsed, query = parse_url(consensus_url)
    if parsed.password is None or "tls_ca" not in query:
        pytest.fail(
            "the security section needs a secured server: a URL with a password and tls_ca "
            "(consensus servers run NAME --secure -- consensus conformance '$CONSENSUS_URL')",
            pytrace=False,
        )
    return parsed, query, Path(query["tls_ca"]).parent


def _connect(url: BackendURL, options: dict[str, Any]) -> consensus_api.Session:
    return consensus_api.connect(url.unredacted(), **options)


def _refused(url: BackendURL, options: dict[str, Any], *words: str) -> ConsensusError:
    """Connect, expect a refusal naming one of ``words`` within ``REFUSAL_BOUND``; the error."""
    started = time.monotonic()
    with pytest.raises(ConsensusError) as refused:
        _connect(url, {**options, "connect_timeout": CONNECT_TIMEOUT}).close()
    elapsed = time.monotonic() - started
    message = str(refused.value)
    assert any(word in message for word in words), f"the cause is not named: {message}"
    assert elapsed < REFUSAL_BOUND, f"refused after {elapsed:.2f} s: retried? ({message})"
    return refused.value


@pytest.fixture
def debug_log(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    caplog.set_level(logging.DEBUG)
    yield caplog


def test_contract_works_over_tls_with_authentication(
    secured: tuple[BackendURL, dict[str, str], Path], consensus_ns: str
) -> None:
    url, options, _ = secured
    with _connect(url, options) as session:
        version = session.storage.put(f"{consensus_ns}/k", b"over tls")
        assert session.storage.fetch(f"{consensus_ns}/k") == consensus_api.Versioned(b"over tls", version)
        session.group(f"{consensus_ns}-g").join("m")
        assert session.election(f"{consensus_ns}-e").nominate("c") is not None


def test_credentials_given_as_options_are_used(
    secured: tuple[BackendURL, dict[str, str], Path], consensus_ns: str
) -> None:
    """``username`` and ``password`` as options log in as the URL's userinfo does; a wrong password given
    so is refused as one in the URL is."""
    url, options, _ = secured
    bare = replace(url, username=None, password=None)
    credentials = {"username": url.username, "password": url.password}
    with _connect(bare, {**options, **credentials}) as session:
        session.storage.put(f"{consensus_ns}/k", b"as options")
        assert session.storage.fetch(f"{consensus_ns}/k") is not None
    wrong = {**credentials, "password": "wrong-" + "0" * 10}
    error = _refused(bare, {**options, **wrong}, "authentication", "auth", "refused access")
    assert isinstance(error, consensus_api.ConfigurationError)


def test_wrong_password_fails_at_once_naming_authentication(
    secured: tuple[BackendURL, dict[str, str], Path],
) -> None:
    url, options, _ = secured
    wrong = "wrong-" + "0" * 10
    error = _refused(replace(url, password=wrong), options, "authentication", "auth", "refused access")
    assert isinstance(error, consensus_api.ConfigurationError)
    assert wrong not in str(error) and wrong not in repr(error)


def test_unknown_ca_fails_at_connect(secured: tuple[BackendURL, dict[str, str], Path]) -> None:
    url, options, certificates = secured
    _refused(url, {**options, "tls_ca": str(certificates / "other-ca.pem")}, *CERTIFICATE_WORDS)


@pytest.mark.parametrize("presented", ["other-host", "expired", "impostor"])
def test_bad_server_certificate_fails_before_anything_is_sent(
    secured: tuple[BackendURL, dict[str, str], Path], presented: str
) -> None:
    """A certificate for another host name, an expired one, or one from another CA, presented by an
    endpoint that counts what it receives: refused at connect, and no request reaches it."""
    url, options, certificates = secured
    with Impostor(certificates, presented) as impostor:
        endpoints = tuple(replace(endpoint, port=impostor.port) for endpoint in url.endpoints[:1])
        _refused(replace(url, endpoints=endpoints), options, *CERTIFICATE_WORDS)
    assert impostor.received == 0, f"{impostor.received} bytes reached an impostor"


def test_user_cannot_use_another_prefix(
    secured: tuple[BackendURL, dict[str, str], Path], consensus_ns: str
) -> None:
    """The server confines the user to its own prefix: a read and a write below ``/elsewhere`` are each
    refused for lack of permission (``PermissionDeniedError``, at connect or at the call), while the
    same calls in the user's own prefix succeed."""
    url, options, _ = secured
    key = f"{consensus_ns}/k"
    calls: list[Callable[[consensus_api.Session], object]] = [
        lambda session: session.storage.put(key, b"must not land"),
        lambda session: session.storage.fetch(key),
    ]
    with _connect(url, options) as session:
        for call in calls:
            call(session)
    elsewhere = replace(url, path="/elsewhere")
    for call in calls:
        with (
            pytest.raises(consensus_api.PermissionDeniedError),
            _connect(elsewhere, {**options, "connect_timeout": CONNECT_TIMEOUT}) as session,
        ):
            call(session)


def test_credentials_without_tls_log_one_warning(
    secured: tuple[BackendURL, dict[str, str], Path], caplog: pytest.LogCaptureFixture
) -> None:
    url, options, _ = secured
    caplog.set_level(logging.WARNING, logger="consensus_api")
    plain = {name: value for name, value in options.items() if not name.startswith("tls")}
    with pytest.raises(ConsensusError):
        _connect(url, {**plain, "tls": False, "connect_timeout": 1}).close()
    warnings = [r.getMessage() for r in caplog.records if "without TLS" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].startswith(url.scheme), warnings


def test_no_password_in_errors_logs_or_reprs(
    secured: tuple[BackendURL, dict[str, str], Path],
    debug_log: pytest.LogCaptureFixture,
    consensus_ns: str,
) -> None:
    url, options, _ = secured
    password = url.password
    assert password is not None
    shown: list[str] = []
    with _connect(url, options) as session:
        session.storage.put(f"{consensus_ns}/k", b"v")
        shown += [repr(session), str(session), repr(session.settings), repr(url), str(url)]
    for bad in (replace(url, password=password + "x"), replace(url, path="/elsewhere")):
        with pytest.raises(ConsensusError) as refused:
            _connect(bad, {**options, "connect_timeout": CONNECT_TIMEOUT}).close()
        shown += [str(refused.value), repr(refused.value)]
    shown += [record.getMessage() for record in debug_log.records]
    assert not [text for text in shown if password in text]


def test_no_password_in_cli_output_or_child_command_lines(
    secured: tuple[BackendURL, dict[str, str], Path], consensus_url: str, consensus_spawn_worker: Any
) -> None:
    url, _, _ = secured
    password = url.password
    assert password is not None
    worker = consensus_spawn_worker("put", "ct/security/worker")
    worker.expect("READY", 30)
    assert password not in " ".join(psutil.Process(worker.pid).cmdline())
    env = {**os.environ, "CONSENSUS_URL": consensus_url}
    done = subprocess.run(
        [sys.executable, "-m", "consensus_api.cli", "ping"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert password not in done.stdout + done.stderr
