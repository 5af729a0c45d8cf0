"""How ``connect`` builds a session's backend: under its store's term floor, or bridged (``migrate_to``)."""

from __future__ import annotations

import os
from functools import partial
from typing import Any

from consensus_api import config, registry
from consensus_api.backend import Backend
from consensus_api.config import BackendURL
from consensus_api.errors import ConfigurationError
from consensus_api.floor import BackendFactory, FloorBackend

#: The connect option, and the variable that supplies it when the URL comes from the environment.
MIGRATE_TO = "migrate_to"
ENV_MIGRATE_TO = "CONSENSUS_MIGRATE_TO"


def session_backend(
    backend_class: type[Backend], url: BackendURL, options: dict[str, Any], *, from_environment: bool
) -> BackendFactory:
    """What a session on ``url`` runs on: the backend under its term floor, or with ``migrate_to``
    (taken out of ``options``; ``$CONSENSUS_MIGRATE_TO`` when ``from_environment``) a bridge to that
    store, whose URL and options (its own query plus the common options) are checked here, before
    any I/O."""
    target = options.pop(MIGRATE_TO, None)
    if target is None and from_environment:
        target = os.environ.get(ENV_MIGRATE_TO) or None
    if target is None:
        return partial(FloorBackend, backend_class)
    if not isinstance(target, str):
        raise ConfigurationError(f"option {MIGRATE_TO!r} must be a backend URL, not {type(target).__name__}")
    new_url, query = config.parse_url(target)
    if new_url.unredacted() == url.unredacted():
        raise ConfigurationError(f"option {MIGRATE_TO!r} names the session's own store ({url.redacted()})")
    new_class = registry.load_backend(new_url.scheme)
    common = {name: value for name, value in options.items() if name in config.COMMON_OPTIONS}
    new_options = config.build_options({**common, **query}, new_class.options, new_url.scheme, new_url)
    from consensus_api.bridging import BridgeBackend  # noqa: PLC0415 - only a bridged session loads it

    return partial(
        BridgeBackend,
        old_factory=backend_class,
        new_factory=new_class,
        new_url=new_url,
        new_options=new_options,
    )
