"""Errors: bad input, bad URLs and options, unreachable backends, secrets.

Contract: sections 2, 4, 9 of <https://consensus-api.github.io/consensus-api/spec/>
"""

from __future__ import annotations

import logging
import socket
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest

import consensus_api
from consensus_api import (
    BackendUnavailableError,
    ConfigurationError,
    ConsensusError,
    InvalidKeyError,
    InvalidTypeError,
    Session,
    ValueTooLargeError,
)
from consensus_api.config import parse_url
from consensus_testkit.conformance.helpers import unique
from consensus_testkit.profile import TestProfile, profile_for

MIB = 1024 * 1024

SPEC_ERRORS = (
    "ConfigurationError",
    "BackendUnavailableError",
    "SessionLostError",
    "KeyExistsError",
    "KeyNotFoundError",
    "VersionConflictError",
    "MemberExistsError",
    "NotAMemberError",
    "FencedError",
    "InvalidKeyError",
    "ValueTooLargeError",
    "OperationTimeoutError",
)

BAD_KEYS = {
    "empty": "",
    "empty segment": "a//b",
    "leading slash": "/a/b",
    "trailing slash": "a/b/",
    "dot segment": "a/./b",
    "dot-dot segment": "a/../b",
    "lone dot": ".",
    "NUL": "a/b\x00c",
    "newline": "a/b\nc",
    "DEL": "a/\x7f",
    "C1 control": "a/\x85",
    "256-char segment": "a/" + "x" * 256,
    "over 1024 bytes": "/".join(["y" * 250] * 5),
    "over 1024 bytes in UTF-8": "/".join(["é" * 200] * 3),
}


def _type_name(value: object) -> str:
    """A stable test id: the argument's type name."""
    return type(value).__name__


def _messages(error: BaseException) -> Iterator[str]:
    """str() and repr() of the error and of every error it was raised from or during."""
    seen: BaseException | None = error
    while seen is not None:
        yield str(seen)
        yield repr(seen)
        seen = seen.__cause__ or seen.__context__


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _unreachable(url: str, workdir: Path, password: str | None = None) -> str:
    """The tested URL where nobody serves it (the backend's test profile says where), keeping scheme
    and path. With ``password``, the URL carries it (and a user name if it had none)."""
    parsed = parse_url(url)[0]
    moved = profile_for(parsed).unreachable_url(parsed, workdir)
    if password is not None:
        moved = replace(moved, username=moved.username or "ct-user", password=password)
    return moved.unredacted()


@pytest.mark.parametrize("case", sorted(BAD_KEYS))
def test_invalid_key_raises_invalid_key_error(consensus_shared_session: Session, case: str) -> None:
    """Each key rule: a breaking key raises InvalidKeyError (a ConsensusError, ValueError) in every call."""
    key, storage = BAD_KEYS[case], consensus_shared_session.storage
    for call in (
        lambda: storage.fetch(key),
        lambda: storage.put(key, b"v"),
        lambda: storage.update(key, b"v"),
        lambda: storage.delete(key),
        lambda: consensus_shared_session.listeners.add_value_listener(key, print),
    ):
        with pytest.raises(InvalidKeyError) as info:
            call()
        assert isinstance(info.value, ConsensusError) and isinstance(info.value, ValueError)


@pytest.mark.parametrize("key", [None, 1, 1.5, b"a/b", ["a"]], ids=_type_name)
def test_non_str_key_raises_invalid_type_error(consensus_shared_session: Session, key: Any) -> None:
    """A key that is not str raises InvalidTypeError, which is both a TypeError and a ConsensusError."""
    with pytest.raises(InvalidTypeError) as info:
        consensus_shared_session.storage.fetch(key)
    assert isinstance(info.value, TypeError) and isinstance(info.value, ConsensusError)
    with pytest.raises(InvalidTypeError):
        consensus_shared_session.storage.put(key, b"v")


def test_boundary_keys_are_accepted(consensus_shared_session: Session, consensus_ns: str) -> None:
    """A 255-character segment and a key of exactly 1024 UTF-8 bytes are valid keys."""
    long_segment = f"{consensus_ns}/" + "s" * 255
    consensus_shared_session.storage.put(long_segment, b"ok")
    assert consensus_shared_session.storage.fetch(long_segment) is not None
    head = f"{consensus_ns}/" + "/".join(["z" * 200] * 4) + "/"
    exact = head + "z" * (1024 - len(head.encode()))
    assert len(exact.encode()) == 1024
    assert 0 < len(exact.rsplit("/", 1)[1]) <= 255
    consensus_shared_session.storage.put(exact, b"ok")
    assert consensus_shared_session.storage.fetch(exact) is not None


def test_invalid_namespace_raises(consensus_shared_session: Session) -> None:
    """keys() and keyset listeners reject a namespace that breaks the key rules; "" is the root."""
    for namespace in ("a/", "/a", "a//b", ".."):
        with pytest.raises(InvalidKeyError):
            consensus_shared_session.storage.keys(namespace)
        with pytest.raises(InvalidKeyError):
            consensus_shared_session.listeners.add_keyset_listener(namespace, print)
    with pytest.raises(InvalidTypeError):
        consensus_shared_session.storage.keys(None)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", ["text", None, 7, bytearray(b"x"), memoryview(b"x")], ids=_type_name)
def test_non_bytes_value_raises_invalid_type_error(
    consensus_shared_session: Session, consensus_ns: str, value: Any
) -> None:
    """A value that is not bytes raises InvalidTypeError on put, update and join."""
    with pytest.raises(InvalidTypeError):
        consensus_shared_session.storage.put(f"{consensus_ns}/k", value)
    with pytest.raises(InvalidTypeError):
        consensus_shared_session.storage.update(f"{consensus_ns}/k", value)
    with pytest.raises(InvalidTypeError):
        consensus_shared_session.group(unique("ct-group")).join("m", value)
    assert consensus_shared_session.storage.fetch(f"{consensus_ns}/k") is None


def test_value_over_one_mebibyte_raises(consensus_shared_session: Session, consensus_ns: str) -> None:
    """A value of 1 MiB + 1 byte raises ValueTooLargeError (a ConsensusError and ValueError) everywhere."""
    big = b"x" * (MIB + 1)
    with pytest.raises(ValueTooLargeError) as info:
        consensus_shared_session.storage.put(f"{consensus_ns}/k", big)
    assert isinstance(info.value, ConsensusError) and isinstance(info.value, ValueError)
    consensus_shared_session.storage.put(f"{consensus_ns}/k", b"small")
    with pytest.raises(ValueTooLargeError):
        consensus_shared_session.storage.update(f"{consensus_ns}/k", big)
    with pytest.raises(ValueTooLargeError):
        consensus_shared_session.group(unique("ct-group")).join("m", big)
    fetched = consensus_shared_session.storage.fetch(f"{consensus_ns}/k")
    assert fetched is not None and fetched.value == b"small"


@pytest.mark.parametrize("version", ["1", 1.0, True, b"1"], ids=_type_name)
def test_bad_version_type_raises(consensus_shared_session: Session, consensus_ns: str, version: Any) -> None:
    """A version that is not an int (or None) raises InvalidTypeError on update and delete."""
    consensus_shared_session.storage.put(f"{consensus_ns}/k", b"v")
    with pytest.raises(InvalidTypeError):
        consensus_shared_session.storage.update(f"{consensus_ns}/k", b"w", version=version)
    with pytest.raises(InvalidTypeError):
        consensus_shared_session.storage.delete(f"{consensus_ns}/k", version=version)
    fetched = consensus_shared_session.storage.fetch(f"{consensus_ns}/k")
    assert fetched is not None and fetched.value == b"v"


@pytest.mark.parametrize("fence", ["leader", 3, ("svc", "leader", 3)], ids=_type_name)
def test_bad_fence_type_raises(consensus_shared_session: Session, consensus_ns: str, fence: Any) -> None:
    """A fence that is not a Leadership raises InvalidTypeError on put, update and delete."""
    with pytest.raises(InvalidTypeError):
        consensus_shared_session.storage.put(f"{consensus_ns}/k", b"v", fence=fence)
    consensus_shared_session.storage.put(f"{consensus_ns}/k", b"v")
    with pytest.raises(InvalidTypeError):
        consensus_shared_session.storage.update(f"{consensus_ns}/k", b"w", fence=fence)
    with pytest.raises(InvalidTypeError):
        consensus_shared_session.storage.delete(f"{consensus_ns}/k", fence=fence)


def test_bad_member_candidate_and_group_names(consensus_shared_session: Session) -> None:
    """Member and candidate ids are single segments; group and service names follow the key rules."""
    group, election = (
        consensus_shared_session.group(unique("ct-group")),
        consensus_shared_session.election(unique("ct-s")),
    )
    for bad in ("", "a/b", ".", "x" * 256, "tab\there"):
        with pytest.raises(InvalidKeyError):
            group.join(bad)
        with pytest.raises(InvalidKeyError):
            election.nominate(bad)
    with pytest.raises(InvalidTypeError):
        group.join(7)  # type: ignore[arg-type]
    for bad in ("", "a//b", "/a", ".."):
        with pytest.raises(InvalidKeyError):
            consensus_shared_session.group(bad)
        with pytest.raises(InvalidKeyError):
            consensus_shared_session.election(bad)
    assert group.members() == frozenset()
    assert election.leadership() is None


def test_non_callable_listener_raises_type_error(
    consensus_shared_session: Session, consensus_ns: str
) -> None:
    """Registering something that is not callable as a listener raises TypeError."""
    with pytest.raises(TypeError):
        consensus_shared_session.listeners.add_value_listener(f"{consensus_ns}/k", "not callable")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        consensus_shared_session.group(unique("ct-group")).add_listener(None)  # type: ignore[arg-type]


def test_errors_are_exported_and_derive_from_consensus_error() -> None:
    """Every error the contract names is importable from consensus_api and is a ConsensusError
    (<https://consensus-api.github.io/consensus-api/spec/#9-errors>)."""
    for name in SPEC_ERRORS:
        error = getattr(consensus_api, name)
        assert issubclass(error, ConsensusError), name
    assert issubclass(InvalidTypeError, TypeError)
    for name in (
        "connect",
        "SessionState",
        "Versioned",
        "Leadership",
        "ValueChanged",
        "KeySetChanged",
        "MembershipChanged",
        "LeaderChanged",
    ):
        assert hasattr(consensus_api, name), name


@pytest.mark.parametrize(
    ("template", "bad_part"),
    [
        ("no scheme at all", "URL"),
        ("{scheme}://127.0.0.1:notaport/ct", "port"),  # not echoed: it may be a password before a lost '@'
        ("{scheme}://127.0.0.1:99999/ct", "99999"),
        ("{scheme}://bad host!/ct", "bad host!"),
        ("{scheme}://127.0.0.1:2379/ct?session_timeout", "query"),
        ("nosuchscheme://127.0.0.1:1/ct", "nosuchscheme"),
    ],
)
def test_malformed_url_raises_configuration_error(consensus_url: str, template: str, bad_part: str) -> None:
    """A malformed URL or unknown scheme raises ConfigurationError naming the bad part."""
    url = template.format(scheme=parse_url(consensus_url)[0].scheme)
    with pytest.raises(ConfigurationError) as info:
        consensus_api.connect(url)
    assert bad_part in str(info.value)


def test_unknown_option_raises_configuration_error(consensus_url: str) -> None:
    """An unknown option, as keyword or as URL query parameter, raises ConfigurationError naming it."""
    with pytest.raises(ConfigurationError, match="no_such_keyword"):
        consensus_api.connect(consensus_url, no_such_keyword=1)
    separator = "&" if "?" in consensus_url else "?"
    with pytest.raises(ConfigurationError, match="no_such_query"):
        consensus_api.connect(f"{consensus_url}{separator}no_such_query=1")


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("session_timeout", -1),
        ("session_timeout", "soon"),
        ("connect_timeout", 0),
        ("request_timeout", "inf"),
        ("auto_rejoin", "maybe"),
        # Outside the documented ranges (<https://consensus-api.github.io/consensus-api/spec/#2-connecting>):
        # each once broke a thread or a wait.
        ("session_timeout", 1e12),
        ("session_timeout", 0.1),
        ("session_timeout", "nan"),
        ("request_timeout", 1e300),
        ("request_timeout", 1e-9),
        ("connect_timeout", 1e-9),
        ("connect_timeout", float("nan")),
        ("connect_timeout", 10**400),
    ],
)
def test_bad_option_value_raises_configuration_error(consensus_url: str, option: str, value: object) -> None:
    """A known option with an unusable value raises ConfigurationError naming the option."""
    with pytest.raises(ConfigurationError, match=option):
        consensus_api.connect(consensus_url, **{option: value})


def test_unreachable_backend_raises_within_connect_timeout(consensus_url: str, tmp_path: Path) -> None:
    """A backend nobody serves raises BackendUnavailableError within connect_timeout plus 1 s."""
    url, timeout = _unreachable(consensus_url, tmp_path), 3.0
    started = time.monotonic()
    with pytest.raises(BackendUnavailableError):
        consensus_api.connect(url, connect_timeout=timeout, request_timeout=timeout, session_timeout=3)
    elapsed = time.monotonic() - started
    assert elapsed < timeout + 1, f"took {elapsed:.1f}s with connect_timeout={timeout}"


def test_credentials_never_appear_in_errors(
    consensus_url: str, consensus_profile: TestProfile, tmp_path: Path
) -> None:
    """A password in the URL never shows in ConfigurationError or BackendUnavailableError messages."""
    secret = f"ct-secret-{uuid.uuid4().hex}"
    scheme = parse_url(consensus_url)[0].scheme
    with pytest.raises(ConfigurationError) as config_info:
        consensus_api.connect(f"{scheme}://ct-user:{secret}@127.0.0.1:{_free_port()}/ct", no_such_option=1)
    # a URL that cannot carry credentials is refused (ConfigurationError); elsewhere nobody serves it
    unreachable = BackendUnavailableError if consensus_profile.credentials_in_url else ConfigurationError
    with pytest.raises(unreachable) as connect_info:
        consensus_api.connect(
            _unreachable(consensus_url, tmp_path, secret), connect_timeout=3, request_timeout=3
        )
    for error in (config_info.value, connect_info.value):
        for message in _messages(error):
            assert secret not in message, message


def _with_password(url: str, secret: str) -> str:
    """The tested URL with ``secret`` as its password (and a user name if it had none)."""
    parsed, query = parse_url(url)
    moved = replace(parsed, username=parsed.username or "ct-user", password=secret)
    return moved.unredacted() + (f"?{urlencode(query)}" if query else "")


def test_credentials_never_appear_in_repr_or_logs(
    consensus_url: str,
    consensus_options: dict[str, object],
    caplog: pytest.LogCaptureFixture,
    consensus_ns: str,
) -> None:
    """With a password in the URL, neither repr(session), any error nor any log record shows it."""
    caplog.set_level(logging.DEBUG)
    secret = f"ct-secret-{uuid.uuid4().hex}"
    texts: list[str] = []
    try:
        with consensus_api.connect(
            _with_password(consensus_url, secret), **{**consensus_options, "connect_timeout": 5}
        ) as session:
            texts += [repr(session), str(session.url)]
            assert ":***@" in texts[0], f"the password is not shown masked: {texts[0]}"
            session.storage.put(f"{consensus_ns}/k", b"v")
    except ConsensusError as exc:  # a backend may refuse the credentials: then the error must not leak them
        texts += _messages(exc)
    formatter = logging.Formatter()
    texts += [formatter.format(record) for record in caplog.records]
    for text in texts:
        assert secret not in text, text
