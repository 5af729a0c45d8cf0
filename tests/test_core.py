"""The backend-independent core: key rules, URL and option parsing, registry, dispatcher."""

from __future__ import annotations

import threading
import time
from functools import partial
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import consensus_api as ca
from consensus_api import config, keys, registry
from consensus_api.backend import lapses_at, retry_pause
from consensus_api.dispatch import Dispatcher


@pytest.mark.parametrize("key", ["a", "a/b/c", "ä/ß", "x" * 255, "/".join(["k" * 200] * 5)])
def test_valid_keys_pass(key: str) -> None:
    """Keys within every rule are returned unchanged."""
    assert keys.check_key(key) == key


@pytest.mark.parametrize(
    "key",
    [
        "",
        "/a",
        "a/",
        "a//b",
        ".",
        "a/./b",
        "..",
        "a/../b",
        "a\nb",
        "a\x00",
        "a\x7f",
        "x" * 256,
        "/".join(["k" * 250] * 5),
    ],
)
def test_invalid_keys_raise(key: str) -> None:
    """Each key rule is enforced with InvalidKeyError, a ConsensusError and ValueError."""
    with pytest.raises(ca.InvalidKeyError) as info:
        keys.check_key(key)
    assert isinstance(info.value, ca.ConsensusError)
    assert isinstance(info.value, ValueError)


def _key_rule(key: str) -> bool:
    """The key rule, written out plainly: <https://consensus-api.github.io/consensus-api/spec/#4-storage-kip-30-storage>."""
    try:
        size = len(key.encode("utf-8"))
    except UnicodeEncodeError:
        return False
    return size <= keys.MAX_KEY_BYTES and all(
        0 < len(segment) <= keys.MAX_SEGMENT_CHARS
        and segment not in (".", "..")
        and not any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in segment)
        for segment in key.split("/")
    )


_KEY_PARTS = [
    "a",
    "Z9",
    ".",
    "..",
    "/",
    "-_ ",
    "\x00",
    "\x1f",
    "\x7f",
    "\x85",
    "\xa0",
    "ä",
    "\ud800",
    "x" * 120,
]


@settings(max_examples=3000, deadline=None)
@given(st.lists(st.sampled_from(_KEY_PARTS), max_size=12))
def test_check_key_accepts_exactly_the_keys_the_rule_allows(parts: list[str]) -> None:
    """Whatever path a key takes through the check (the one-match path for plain ASCII keys, or the
    segment by segment one), it is accepted if and only if the spec's rule allows it."""
    key = "".join(parts)
    try:
        accepted = keys.check_key(key) == key
    except ca.InvalidKeyError:
        accepted = False
    assert accepted == _key_rule(key), repr(key)


def test_non_str_key_and_non_bytes_value_are_type_errors() -> None:
    """Wrong types raise InvalidTypeError, which is also a TypeError."""
    with pytest.raises(TypeError):
        keys.check_key(b"a")
    with pytest.raises(ca.InvalidTypeError):
        keys.check_value("text")
    with pytest.raises(ca.ValueTooLargeError):
        keys.check_value(b"x" * (keys.MAX_VALUE_BYTES + 1))
    assert keys.check_value(b"x" * keys.MAX_VALUE_BYTES)


def test_member_ids_are_single_segments() -> None:
    """Member and candidate ids may not contain '/'."""
    assert keys.check_segment("worker-1", "member id") == "worker-1"
    with pytest.raises(ca.InvalidKeyError):
        keys.check_segment("a/b", "member id")


def test_parse_url_multi_host_credentials_and_query() -> None:
    """Host lists, ports, IPv6, credentials and query options are parsed; the password is redacted."""
    url, query = config.parse_url("zk://user:s%40cret@h1:2181,[::1]:2182,h3/chroot/x?session_timeout=5")
    assert url.scheme == "zk"
    assert url.endpoints == (
        config.Endpoint("h1", 2181),
        config.Endpoint("::1", 2182),
        config.Endpoint("h3", None),
    )
    assert (url.username, url.password, url.path) == ("user", "s@cret", "/chroot/x")
    assert query == {"session_timeout": "5"}
    assert "s@cret" not in repr(url) and "s@cret" not in str(url)
    assert url.redacted() == "zk://user:***@h1:2181,[::1]:2182,h3/chroot/x"
    assert url.host_list(2181) == "h1:2181,::1:2182,h3:2181"


@pytest.mark.parametrize(
    "bad", ["nourl", "://x", "etcd://h:99999", "etcd://h:port", "etcd://bad host:1", "etcd://[::1:2379/x"]
)
def test_malformed_urls_raise_configuration_error(bad: str) -> None:
    """Malformed URLs are ConfigurationErrors."""
    with pytest.raises(ca.ConfigurationError):
        config.parse_url(bad)


def test_options_are_checked_and_typed() -> None:
    """Common options are parsed to their types; unknown ones and bad values are rejected by name."""
    options = config.build_options({"session_timeout": "2.5", "auto_rejoin": "no"}, {}, "sqlite")
    assert options.session_timeout == 2.5 and options.auto_rejoin is False
    with pytest.raises(ca.ConfigurationError, match="bogus"):
        config.build_options({"bogus": 1}, {}, "sqlite")
    with pytest.raises(ca.ConfigurationError, match="session_timeout"):
        config.build_options({"session_timeout": "-1"}, {}, "sqlite")


def test_resolution_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An explicit URL beats $CONSENSUS_URL, which beats consensus.toml, which beats the default."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CONSENSUS_URL", raising=False)
    monkeypatch.delenv("CONSENSUS_CONFIG", raising=False)
    assert config.resolve(None) == (config.DEFAULT_URL, {})
    (tmp_path / "consensus.toml").write_text('url = "etcd://h:1/p"\nsession_timeout = 4\n')
    assert config.resolve(None) == ("etcd://h:1/p", {"session_timeout": 4})
    monkeypatch.setenv("CONSENSUS_URL", "zk://h:2/q")
    assert config.resolve(None) == ("zk://h:2/q", {})
    assert config.resolve("sqlite:///x.db") == ("sqlite:///x.db", {})
    monkeypatch.delenv("CONSENSUS_URL")
    monkeypatch.setenv("CONSENSUS_CONFIG", str(tmp_path / "missing.toml"))
    with pytest.raises(ca.ConfigurationError, match=r"missing\.toml"):
        config.resolve(None)


def test_connect_uses_config_file_options(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Options from consensus.toml reach the session; keyword arguments win over them."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CONSENSUS_URL", raising=False)
    monkeypatch.delenv("CONSENSUS_CONFIG", raising=False)
    (tmp_path / "consensus.toml").write_text('url = "sqlite:///c.db"\nsession_timeout = 4\n')
    with ca.connect(request_timeout=3) as session:
        assert session.backend == "sqlite"
        assert (session.settings.session_timeout, session.settings.request_timeout) == (4.0, 3.0)
    assert (tmp_path / "c.db").exists()


def test_unknown_scheme_and_missing_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """An unknown scheme names the known ones; a backend whose import fails names the distribution that
    provides its entry point, with the entry point's extra (ours, or a third party's)."""
    with pytest.raises(ca.ConfigurationError, match="known schemes"):
        registry.load_backend("nosuch")
    ours = next(ep for ep in entry_points(group=registry.GROUP) if ep.name == "postgresql")
    assert registry.install_hint(ours) == "pip install 'consensus-api[postgresql]'"
    info = tmp_path / "their_dist-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: their-dist\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        f"[{registry.GROUP}]\ntheirs = their_missing_module_xyz:Backend [fast]\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    registry._entry_points.cache_clear()
    monkeypatch.setattr(registry, "_entry_points", registry._entry_points.__wrapped__)
    with pytest.raises(ca.ConfigurationError, match=r"pip install 'their-dist\[fast\]'"):
        registry.load_backend("theirs")


def test_register_validates_at_once_and_wins_over_entry_points(monkeypatch: pytest.MonkeyPatch) -> None:
    """register() rejects a bad scheme or target before any use; a registered scheme serves URLs (and
    replaces an entry point of the same name); a target that is not a Backend is refused on use."""
    monkeypatch.setattr(registry, "_registered", {})
    for scheme, target in (("Bad Scheme", "m:C"), ("9x", "m:C"), ("ok", "no colon"), ("ok", "m:")):
        with pytest.raises(ca.ConfigurationError):
            registry.register(scheme, target)
    assert registry._registered == {}
    registry.register("kafka", "consensus_backends.sql:SQLBackend")
    assert registry.load_backend("kafka").__name__ == "SQLBackend"
    registry.register("mystore", "consensus_api.errors:ConfigurationError")
    assert "mystore" in registry.schemes()
    with pytest.raises(ca.ConfigurationError, match="not name a Backend subclass"):
        registry.load_backend("mystore")


def test_every_builtin_scheme_is_registered() -> None:
    """The distribution registers all built-in schemes by entry point."""
    assert {
        "sqlite",
        "postgresql",
        "postgresql+psycopg",
        "zookeeper",
        "zk",
        "etcd",
        "kafka",
    } <= registry.schemes()


def test_dispatcher_runs_in_order_on_one_thread_and_survives_errors() -> None:
    """Tasks run in order on the dispatcher thread; a raising task does not stop later ones."""
    dispatcher = Dispatcher("test")
    seen: list[tuple[int, str]] = []
    done = threading.Event()

    def fail() -> None:
        raise RuntimeError("boom")

    def record(i: int) -> None:
        seen.append((i, threading.current_thread().name))

    for i in range(5):
        dispatcher.submit(partial(record, i))
    dispatcher.submit(fail)
    dispatcher.submit_later(0.05, done.set)
    assert done.wait(5)
    dispatcher.stop(5)
    assert [i for i, _ in seen] == list(range(5))
    assert {name for _, name in seen} == {"consensus-dispatch-test"}


def test_a_renewed_lease_is_presumed_lapsed_a_margin_before_it_can_expire() -> None:
    """A tenth of the session timeout, at most 0.2 s, before the server can expire it; a session in
    trouble tries again at that moment, not only every pause."""
    assert lapses_at(100.0, 1.0) == pytest.approx(100.9)
    assert lapses_at(100.0, 3.0) == pytest.approx(102.8)
    assert lapses_at(100.0, 60.0) == pytest.approx(159.8)
    now = time.monotonic()
    assert retry_pause(0.25, now + 10, 0.01) == 0.25
    assert 0.01 < retry_pause(0.25, now + 0.1, 0.01) <= 0.1
    assert retry_pause(0.25, now - 1, 0.01) == 0.01
