"""Resolving the backend URL and options (<https://consensus-api.github.io/consensus-api/spec/#2-connecting>).

Resolution order for the URL: the ``url`` argument, ``$CONSENSUS_URL``,
``consensus.toml`` in the working directory (or the file ``$CONSENSUS_CONFIG``
names), then the embedded default ``sqlite:///consensus.db``. Options come
from the config file, then URL query parameters, then keyword arguments; later
sources win. Every value is checked here, before any I/O.
"""

from __future__ import annotations

import logging
import math
import os
import re
import ssl
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, unquote

from consensus_api.errors import ConfigurationError

log = logging.getLogger("consensus_api")

DEFAULT_URL = "sqlite:///consensus.db"
ENV_URL = "CONSENSUS_URL"
ENV_CONFIG = "CONSENSUS_CONFIG"
CONFIG_FILE = "consensus.toml"

OptionParser = Callable[[Any], object]

_URL_RE = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://(?P<rest>.*)$", re.DOTALL)


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One server address of a backend URL."""

    host: str
    port: int | None


@dataclass(frozen=True, slots=True)
class BackendURL:
    """A parsed backend URL; the password never appears in its repr or ``str``."""

    scheme: str
    endpoints: tuple[Endpoint, ...]
    path: str
    username: str | None = None
    password: str | None = field(default=None, repr=False)

    def redacted(self) -> str:
        """The URL with the password replaced by ``***``, safe for logs and errors."""
        return self._render(mask=True)

    def unredacted(self) -> str:
        """The URL with its credentials, for handing to a client library only."""
        return self._render(mask=False)

    def host_list(self, default_port: int) -> str:
        """``h1:p1,h2:p2`` with ``default_port`` where a port is absent."""
        return ",".join(f"{e.host}:{e.port or default_port}" for e in self.endpoints)

    def __str__(self) -> str:
        return self.redacted()

    def _render(self, *, mask: bool) -> str:
        auth = ""
        if self.username is not None:
            auth = quote(self.username, safe="")
            if self.password is not None:
                auth += ":" + ("***" if mask else quote(self.password, safe=""))
            auth += "@"
        hosts = ",".join(
            (f"[{e.host}]" if ":" in e.host else e.host) + (f":{e.port}" if e.port else "")
            for e in self.endpoints
        )
        return f"{self.scheme}://{auth}{hosts}{self.path}"


_USERINFO_PASSWORD_RE = re.compile(r"(://[^/@:?#]*:)[^/@?#]*@")


def redact_text(text: str) -> str:
    """``text`` with the password of every ``scheme://user:password@`` in it replaced by ``***``."""
    return _USERINFO_PASSWORD_RE.sub(r"\1***@", text)


def parse_url(url: str) -> tuple[BackendURL, dict[str, str]]:
    """Split ``url`` into a ``BackendURL`` and its query parameters."""
    if not isinstance(url, str):
        raise ConfigurationError(f"the URL must be a str, not {type(url).__name__}")
    match = _URL_RE.match(url.strip())
    if match is None:
        raise ConfigurationError(
            "malformed URL: expected 'scheme://hosts/path', e.g. 'etcd://127.0.0.1:2379/app'"
        )
    scheme = match["scheme"].lower()
    rest, _, query = match["rest"].partition("?")
    netloc, slash, path = rest.partition("/")
    username = password = None
    if "@" in netloc:
        userinfo, _, netloc = netloc.rpartition("@")
        user, colon, secret = userinfo.partition(":")
        username = unquote(user)
        password = unquote(secret) if colon else None
    endpoints = tuple(_parse_endpoint(part, scheme) for part in netloc.split(",") if part)
    if netloc and not endpoints:
        raise ConfigurationError(f"malformed host list in the {scheme}:// URL")
    try:
        params = dict(parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query)))
    except ValueError:
        raise ConfigurationError(f"malformed query string in the {scheme}:// URL") from None
    return BackendURL(scheme, endpoints, slash + path, username, password), params


def _parse_endpoint(text: str, scheme: str) -> Endpoint:
    host, port_text = text, ""
    if text.startswith("["):
        host, bracket, tail = text[1:].partition("]")
        if not bracket:
            raise ConfigurationError(f"malformed host {text!r} in the {scheme}:// URL (no closing ']')")
        port_text = tail[1:] if tail.startswith(":") else tail
        if tail and not tail.startswith(":"):
            raise ConfigurationError(f"malformed host {text!r} in the {scheme}:// URL")
    elif ":" in text:
        host, _, port_text = text.rpartition(":")
    if not host or not re.fullmatch(r"[A-Za-z0-9._:%-]+", host):
        raise ConfigurationError(f"malformed host {host!r} in the {scheme}:// URL")
    if not port_text:
        return Endpoint(host, None)
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        # Only digits are echoed: 'user:password' without its '@' puts the password here.
        shown = repr(port_text) if port_text.isdigit() else "(not a number: is an '@' missing?)"
        raise ConfigurationError(f"malformed port {shown} in the {scheme}:// URL (expected 1-65535)")
    return Endpoint(host, int(port_text))


#: One day: the longest timeout, session or interval any option accepts (a thread's wait, a
#: lease or a heartbeat beyond it overflows or never fires in some client library).
MAX_SECONDS = 86400.0


def seconds(low: float, high: float = MAX_SECONDS) -> Callable[[Any], float]:
    """A parser of a number of seconds from ``low`` to ``high`` (NaN, inf and bools refused)."""

    def parse(value: Any) -> float:
        try:
            number = float(value)
        except (TypeError, ValueError, OverflowError):
            number = math.nan
        if isinstance(value, bool) or not low <= number <= high:
            raise ValueError(f"expected a number of seconds from {low:g} to {high:g}, got {value!r}")
        return number

    return parse


#: The ranges of the common timing options (<https://consensus-api.github.io/consensus-api/spec/#2-connecting>).
SESSION_TIMEOUT = seconds(0.5)
CALL_TIMEOUT = seconds(0.01)


def boolean(value: Any) -> bool:
    """Parse a bool from a bool or one of true/false/1/0/yes/no/on/off."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected true or false, got {value!r}")


def string(value: Any) -> str:
    """Parse a non-empty string."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"expected a non-empty string, got {value!r}")
    return value


class Secret(str):
    """A credential: a ``str`` whose ``repr`` never shows its value."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "'***'"


def secret(value: Any) -> Secret:
    """Parse a non-empty secret string."""
    if not isinstance(value, str) or not value:
        raise ValueError("expected a non-empty string")
    return Secret(value)


@dataclass(frozen=True, slots=True)
class Alias:
    """A backend's own name for a common option, listed in ``Backend.options`` in place of a parser."""

    name: str

    def __call__(self, value: Any) -> object:
        raise TypeError(f"alias of {self.name!r}: build_options renames it before parsing")


COMMON_OPTIONS: Mapping[str, OptionParser] = {
    "session_timeout": SESSION_TIMEOUT,
    "connect_timeout": CALL_TIMEOUT,
    "request_timeout": CALL_TIMEOUT,
    "auto_rejoin": boolean,
}

#: TLS and authentication, the same on every backend whose options list ``tls`` (<https://consensus-api.github.io/consensus-api/spec/#2-connecting>).
SECURITY_OPTIONS: Mapping[str, OptionParser] = {
    "tls": boolean,
    "tls_ca": string,
    "tls_cert": string,
    "tls_key": string,
    "tls_key_password": secret,
    "username": string,
    "password": secret,
}


@dataclass(frozen=True, slots=True)
class Security:
    """Checked TLS and credential settings; the passwords never appear in a repr.

    With ``tls``, the server is verified (chain and host name) against
    ``tls_ca`` alone when given, else against the system's trust store.
    """

    tls: bool = False
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_key_password: Secret | None = field(default=None, repr=False)
    username: str | None = None
    password: Secret | None = field(default=None, repr=False)

    @property
    def has_credentials(self) -> bool:
        """A user name or a password is configured."""
        return self.username is not None or self.password is not None

    @property
    def sends_password_in_clear(self) -> bool:
        """A password is configured without TLS."""
        return self.password is not None and not self.tls

    def ssl_context(self) -> ssl.SSLContext:
        """A client context: TLS 1.2+, chain and host name checked, the client certificate loaded."""
        context = ssl.create_default_context(cafile=self.tls_ca)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.tls_cert is not None:
            context.load_cert_chain(self.tls_cert, self.tls_key, password=self.tls_key_password)
        return context


def _security(given: Mapping[str, Any], url: BackendURL | None, backend_name: str) -> Security:
    """Check the security options together; ``url`` contributes its user name and password."""
    values = dict(given)
    from_url = {"username": (url and url.username) or None, "password": url and url.password}
    for name, value in from_url.items():
        if value is None:
            continue
        if name in values and values[name] != value:
            raise ConfigurationError(f"the {name} is given both in the URL and as an option, differently")
        values[name] = value if name == "username" else Secret(value)
    files = [name for name in ("tls_ca", "tls_cert", "tls_key") if name in values]
    for name in files:
        if not Path(values[name]).is_file():
            raise ConfigurationError(f"option {name!r}: no such file: {values[name]}")
    if ("tls_cert" in values) != ("tls_key" in values):
        raise ConfigurationError("options 'tls_cert' and 'tls_key' must be given together")
    if "tls_key_password" in values and "tls_key" not in values:
        raise ConfigurationError("option 'tls_key_password' needs 'tls_key'")
    if files and not values.setdefault("tls", True):
        raise ConfigurationError(f"options {', '.join(files)} need tls=true")
    security = Security(**values)
    if security.sends_password_in_clear:
        log.warning("%s: credentials are sent without TLS (set tls=true to encrypt them)", backend_name)
    return security


@dataclass(frozen=True, slots=True)
class Options:
    """Checked connection options; backend-specific ones are in ``extra``."""

    session_timeout: float = 10.0
    connect_timeout: float = 10.0
    request_timeout: float = 10.0
    auto_rejoin: bool = True
    security: Security = field(default_factory=Security)
    extra: Mapping[str, object] = field(default_factory=dict, repr=False)


def build_options(
    raw: Mapping[str, Any],
    backend_options: Mapping[str, OptionParser],
    backend_name: str,
    url: BackendURL | None = None,
) -> Options:
    """Check every option against the common, security and backend's own parsers, before any I/O.

    The security options apply to backends that list ``tls`` in their options
    (or an ``Alias`` of it); ``url`` supplies the user name and password.
    """
    secured = "tls" in backend_options or Alias("tls") in backend_options.values()
    known = {**COMMON_OPTIONS, **(SECURITY_OPTIONS if secured else {})}
    sections: dict[str, dict[str, Any]] = {"common": {}, "security": {}, "extra": {}}
    for given_name, value in raw.items():
        target = backend_options.get(given_name)
        name = target.name if isinstance(target, Alias) else given_name
        if name != given_name and name in raw:
            raise ConfigurationError(f"options {given_name!r} and {name!r} name the same setting")
        parser = known.get(name) or (None if isinstance(target, Alias) else target)
        if parser is None:
            names = ", ".join(sorted({*known, *backend_options}))
            raise ConfigurationError(
                f"unknown option {given_name!r} for the {backend_name} backend; known options: {names}"
            )
        try:
            parsed = parser(value)
        except ValueError as exc:
            raise ConfigurationError(f"option {given_name!r}: {exc}") from None
        section = "common" if name in COMMON_OPTIONS else "security" if name in known else "extra"
        sections[section][name] = parsed
    security = _security(sections["security"], url, backend_name) if secured else Security()
    return Options(**sections["common"], security=security, extra=sections["extra"])


def resolve(url: str | None) -> tuple[str, dict[str, Any]]:
    """The URL to use and the options from the config file, in the order of <https://consensus-api.github.io/consensus-api/spec/#2-connecting>."""
    if url is not None:
        return url, {}
    env_url = os.environ.get(ENV_URL)
    if env_url:
        return env_url, {}
    config_path = Path(os.environ.get(ENV_CONFIG) or CONFIG_FILE)
    if config_path.is_file():
        return _read_config(config_path)
    if os.environ.get(ENV_CONFIG):
        raise ConfigurationError(f"${ENV_CONFIG} names {config_path}, which does not exist")
    return DEFAULT_URL, {}


def _read_config(path: Path) -> tuple[str, dict[str, Any]]:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigurationError(f"cannot read {path}: {exc}") from None
    url = data.pop("url", DEFAULT_URL)
    if not isinstance(url, str):
        raise ConfigurationError(f"{path}: 'url' must be a string")
    return url, data
