"""Resolving the backend URL and options (docs/spec.md section 2).

Resolution order for the URL: the ``url`` argument, ``$CONSENSUS_URL``,
``consensus.toml`` in the working directory (or the file ``$CONSENSUS_CONFIG``
names), then the embedded default ``sqlite:///consensus.db``. Options come
from the config file, then URL query parameters, then keyword arguments; later
sources win. Every value is checked here, before any I/O.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, unquote

from consensus_api.errors import ConfigurationError

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
        host, _, tail = text[1:].partition("]")
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
        raise ConfigurationError(f"malformed port {port_text!r} in the {scheme}:// URL")
    return Endpoint(host, int(port_text))


def positive_float(value: Any) -> float:
    """Parse a positive number of seconds."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"expected a positive number, got {value!r}") from None
    if isinstance(value, bool) or not number > 0 or number == float("inf"):
        raise ValueError(f"expected a positive number, got {value!r}")
    return number


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


COMMON_OPTIONS: Mapping[str, OptionParser] = {
    "session_timeout": positive_float,
    "connect_timeout": positive_float,
    "request_timeout": positive_float,
    "auto_rejoin": boolean,
}


@dataclass(frozen=True, slots=True)
class Options:
    """Checked connection options; backend-specific ones are in ``extra``."""

    session_timeout: float = 10.0
    connect_timeout: float = 10.0
    request_timeout: float = 10.0
    auto_rejoin: bool = True
    extra: Mapping[str, object] = field(default_factory=dict, repr=False)


def build_options(
    raw: Mapping[str, Any],
    backend_options: Mapping[str, OptionParser],
    backend_name: str,
) -> Options:
    """Check every option against the common and the backend's own parsers."""
    common: dict[str, Any] = {}
    extra: dict[str, object] = {}
    for name, value in raw.items():
        parser = COMMON_OPTIONS.get(name) or backend_options.get(name)
        if parser is None:
            known = ", ".join(sorted({*COMMON_OPTIONS, *backend_options}))
            raise ConfigurationError(
                f"unknown option {name!r} for the {backend_name} backend; known options: {known}"
            )
        try:
            parsed = parser(value)
        except ValueError as exc:
            raise ConfigurationError(f"option {name!r}: {exc}") from None
        (common if name in COMMON_OPTIONS else extra)[name] = parsed
    return Options(**common, extra=extra)


def resolve(url: str | None) -> tuple[str, dict[str, Any]]:
    """The URL to use and the options from the config file, in the order of docs/spec.md section 2."""
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
