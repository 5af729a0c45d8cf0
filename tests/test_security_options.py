"""The security options, parsed once in the core, and secrets kept out of messages (no I/O)."""

from __future__ import annotations

import logging
import ssl
from pathlib import Path

import pytest

import consensus_api as ca
from consensus_api.cli._common import expand_env
from consensus_api.config import Alias, OptionParser, boolean, build_options, parse_url, redact_text
from consensus_testkit.certificates import write_certificates

SECRET = "s3cr3t-pw"
SECURED: dict[str, OptionParser] = {"tls": boolean, "ssl_cafile": Alias("tls_ca")}


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_certificates(tmp_path_factory.mktemp("certs"))


def test_url_credentials_and_options_meet_in_options_security(certificates: Path) -> None:
    url, query = parse_url(f"etcd://alice:{SECRET}@127.0.0.1:2379/app?tls_ca={certificates / 'ca.pem'}")
    options = build_options(query, SECURED, "etcd", url)
    security = options.security
    assert (security.tls, security.tls_ca, security.username) == (True, str(certificates / "ca.pem"), "alice")
    assert security.password == SECRET
    assert SECRET not in repr(options) and SECRET not in repr(security)
    context = security.ssl_context()
    assert context.check_hostname and context.verify_mode == ssl.CERT_REQUIRED
    assert len(context.get_ca_certs()) == 1  # tls_ca alone: no system CA is added


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"username": "bob"}, "both in the URL and as an option"),
        ({"tls_key_password": "x"}, "needs 'tls_key'"),
        ({"tls": "no", "tls_ca": "CA"}, "need tls=true"),
        ({"tls_ca": "/nonexistent.pem"}, "no such file"),
        ({"ssl_cafile": "CA", "tls_ca": "CA"}, "name the same setting"),
        ({"tls_cert": "CA"}, "given together"),
    ],
)
def test_inconsistent_security_options_are_refused(
    certificates: Path, raw: dict[str, str], message: str
) -> None:
    url = parse_url(f"etcd://alice:{SECRET}@127.0.0.1:2379/app")[0]
    values = {name: str(certificates / "ca.pem") if value == "CA" else value for name, value in raw.items()}
    with pytest.raises(ca.ConfigurationError, match=message) as refused:
        build_options(values, SECURED, "etcd", url)
    assert SECRET not in str(refused.value)


def test_a_password_without_tls_logs_one_warning_naming_the_backend(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    url = parse_url(f"zookeeper://alice:{SECRET}@127.0.0.1:2181/app")[0]
    build_options({}, SECURED, "zookeeper", url)
    build_options({}, SECURED, "zookeeper", parse_url("zookeeper://alice@127.0.0.1:2181/app")[0])
    assert [r.getMessage() for r in caplog.records] == [
        "zookeeper: credentials are sent without TLS (set tls=true to encrypt them)"
    ]


def test_backends_without_tls_take_no_security_options() -> None:
    with pytest.raises(ca.ConfigurationError, match="unknown option 'tls_ca'"):
        build_options({"tls_ca": "x"}, {}, "test")
    with pytest.raises(ca.ConfigurationError, match="do not apply to sqlite"):
        ca.connect("sqlite:///x.db", tls=True)


def test_no_password_in_url_error_messages() -> None:
    """'user:password' without its '@', and an unset variable in a URL, name no password."""
    with pytest.raises(ca.ConfigurationError, match="malformed port") as bad_port:
        ca.connect(f"postgresql://alice:{SECRET}/db")
    with pytest.raises(ca.ConfigurationError, match="is not set") as unset:
        expand_env(f"postgresql://alice:{SECRET}@$NO_SUCH_HOST_VAR/db", {})
    for raised in (bad_port, unset):
        assert SECRET not in str(raised.value)
    assert redact_text(f"x kafka://u:{SECRET}@h:1/p y") == "x kafka://u:***@h:1/p y"
