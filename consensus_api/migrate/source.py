"""What a migration reads from: a session of this API, or a raw tree reader found by entry point.

A source names its entries by *paths*: keys for a session; for a raw tree,
paths relative to its root, which may break the key rules (the migration
reports those as keys the target cannot hold). Raw readers register in the
entry-point group ``consensus_api.raw_sources`` under their URL scheme, e.g.
``zookeeper = "consensus_backends.zookeeper.raw:open_source [zookeeper]"``, and are
imported only when a raw migration from that scheme starts.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from importlib.metadata import entry_points
from typing import Any, Protocol, cast

from consensus_api import config, registry
from consensus_api.keys import SEPARATOR, parent_of
from consensus_api.migrate.ledger import reserved
from consensus_api.model import KeySetChanged, ValueChanged
from consensus_api.session import Session, connect

RAW_SOURCES = "consensus_api.raw_sources"

#: ``changed(path, value)``: the state of ``path`` as read just now (None: absent or not a key).
Changed = Callable[[str, bytes | None], None]


class Follow(Protocol):
    """A running subscription to a source's changes."""

    def add(self, paths: Iterable[str]) -> None:
        """Also report changes of ``paths`` (found by a rescan); may be ignored by sources that see all."""

    def close(self) -> None:
        """Stop reporting."""


class Source(Protocol):
    """A tree of paths with values, read linearizably one page or path at a time."""

    def walk(self, prefix: str) -> Iterator[tuple[str, bytes]]:
        """``prefix`` itself (when it holds a value) and every path below it, each once."""

    def fetch(self, path: str) -> bytes | None:
        """The current value at ``path``, or None."""

    def follow(self, prefix: str, changed: Changed) -> Follow:
        """Call ``changed`` (from any thread, quickly) after each change at or below ``prefix``.

        Each path's reports come in the order of its changes, and the last one
        equals its final state; a report may repeat an unchanged state.
        """

    def close(self) -> None:
        """Disconnect."""


RawOpener = Callable[[str, Mapping[str, Any]], Source]


def open_source(url: str, *, raw: bool, options: Mapping[str, Any]) -> Source:
    """A session source for ``url``, or with ``raw`` the raw reader its scheme registered."""
    if not raw:
        return SessionSource(connect(url, **options))
    scheme = config.parse_url(url)[0].scheme
    found = {ep.name: ep for ep in entry_points(group=RAW_SOURCES)}
    opener = cast(RawOpener, registry.load_entry(found, scheme, "raw reader"))
    return opener(url, options)


class SessionSource:
    """The keys of a session (``Storage.walk``/``fetch``), followed with listeners."""

    def __init__(self, session: Session) -> None:
        self.session = session

    def walk(self, prefix: str) -> Iterator[tuple[str, bytes]]:
        """The prefix key and ``Storage.walk(prefix)``, without the migration ledger."""
        if prefix:
            found = self.session.storage.fetch(prefix)
            if found is not None:
                yield prefix, found.value
        for key, found in self.session.storage.walk(prefix):
            if not reserved(key):
                yield key, found.value

    def fetch(self, path: str) -> bytes | None:
        """``Storage.fetch``."""
        found = self.session.storage.fetch(path)
        return None if found is None else found.value

    def follow(self, prefix: str, changed: Changed) -> Follow:
        """Value listeners on every key added, key-set listeners on every namespace above them."""
        return ListenerFollow(self.session, prefix, changed)

    def close(self) -> None:
        """Close the session."""
        self.session.close()


class ListenerFollow:
    """Follows keys with the session's listeners.

    Every key added gets a value listener (its events carry the key's state
    in order, so they report updates, deletes and re-creations), and every
    namespace from ``prefix`` down to the key's parent a key-set listener,
    through which keys created later in a known namespace are added at once.
    A key in a namespace nobody watched (``a/new/deep`` with nothing under
    ``a/new`` before) is found by the follower's periodic rescan.
    """

    def __init__(self, session: Session, prefix: str, changed: Changed) -> None:
        self._listeners = session.listeners
        self._prefix = prefix
        self._changed = changed
        self._lock = threading.Lock()
        self._keys: set[str] = set()
        self._namespaces: set[str] = set()
        self._closed = False
        if prefix:
            self.add([prefix])
        else:
            self._watch_namespace("")

    def add(self, paths: Iterable[str]) -> None:
        """Listen to each of ``paths`` (keys at or below the prefix) and the namespaces above it."""
        for key in paths:
            with self._lock:
                if self._closed or key in self._keys or reserved(key):
                    continue
                self._keys.add(key)
            self._listeners.add_value_listener(key, self._on_value)
            for namespace in self._namespaces_above(key):
                self._watch_namespace(namespace)

    def close(self) -> None:
        """Remove every listener."""
        with self._lock:
            self._closed = True
            keys, namespaces = list(self._keys), list(self._namespaces)
        for key in keys:
            self._listeners.remove_value_listener(key, self._on_value)
        for namespace in namespaces:
            self._listeners.remove_keyset_listener(namespace, self._on_keys)

    def _namespaces_above(self, key: str) -> list[str]:
        namespaces = []
        namespace = parent_of(key)
        while key != self._prefix and (
            namespace == self._prefix or namespace.startswith(self._prefix + SEPARATOR) or not self._prefix
        ):
            namespaces.append(namespace)
            if not namespace:
                break
            key, namespace = namespace, parent_of(namespace)
        return namespaces

    def _watch_namespace(self, namespace: str) -> None:
        with self._lock:
            if self._closed or namespace in self._namespaces:
                return
            self._namespaces.add(namespace)
        self._listeners.add_keyset_listener(namespace, self._on_keys)

    def _on_value(self, event: ValueChanged) -> None:
        self._changed(event.key, event.value)

    def _on_keys(self, event: KeySetChanged) -> None:
        self.add(event.keys)
