"""Keeping one-shot ZooKeeper watches armed for every watched target.

Each target maps to one znode: a value to its anchor (data watch, set with
``exists`` so that it also fires on creation), a namespace, group or
election to its parent znode (child watch; an ``exists`` watch while that
znode is missing). After a watch fires it is armed again and only *then* is
the target reported changed, so the core's re-read comes after the re-arm:
a change either precedes that read or fires the new watch. kazoo drops all
watches when the connection breaks; ``rearm_all`` (called on every
CONNECTED) arms them again and reports every target.

Callbacks run on kazoo's threads and never block: they only send
asynchronous requests and call ``changed`` (which returns at once).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError
from kazoo.protocol.states import EventType

from backends.zookeeper.connection import TRANSIENT
from backends.zookeeper.paths import Layout
from consensus_api.backend import Target, TargetKind

log = logging.getLogger("consensus_api.zookeeper")


class _Watch:
    """The armed watch of one target, until ``cancel``."""

    def __init__(
        self,
        client: KazooClient,
        target: Target,
        path: str,
        children: bool,
        changed: Callable[[Target], None],
    ) -> None:
        self._client = client
        self._target = target
        self._path = path
        self._children = children
        self._changed = changed
        self.active = True

    def arm(self) -> None:
        """Set the watch (again); the target is reported once it is set."""
        if not self.active:
            return
        if self._children:
            self._client.get_children_async(self._path, watch=self._fired).rawlink(self._children_set)
        else:
            self._client.exists_async(self._path, watch=self._fired).rawlink(self._set)

    def _fired(self, event: Any) -> None:
        if self.active and event.type != EventType.NONE:  # NONE: the connection broke; rearm_all follows
            self.arm()

    def _children_set(self, result: Any) -> None:
        if self.active and isinstance(result.exception, NoNodeError):
            # The parent znode does not exist yet: watch for its creation instead.
            self._client.exists_async(self._path, watch=self._fired).rawlink(self._parent_set)
        else:
            self._set(result)

    def _parent_set(self, result: Any) -> None:
        if self.active and result.successful() and result.value is not None:
            self.arm()  # created meanwhile: set the child watch
        else:
            self._set(result)

    def _set(self, result: Any) -> None:
        if not self.active:
            return
        error = result.exception
        if error is None or isinstance(error, NoNodeError):
            self._changed(self._target)
        elif not isinstance(error, TRANSIENT):
            log.warning("cannot watch %s in ZooKeeper: %s", self._target, type(error).__name__)


class Watches:
    """The armed watches of one backend."""

    def __init__(self, client: KazooClient, layout: Layout, changed: Callable[[Target], None]) -> None:
        self._client = client
        self._layout = layout
        self._changed = changed
        self._lock = threading.Lock()
        self._active: dict[Target, _Watch] = {}

    def watch(self, target: Target) -> None:
        """Start watching ``target``; returns at once."""
        with self._lock:
            if target in self._active:
                return
            watch = self._active[target] = _Watch(
                self._client, target, self._path(target), target.kind is not TargetKind.VALUE, self._changed
            )
        watch.arm()

    def unwatch(self, target: Target) -> None:
        """Stop reporting ``target`` (a pending one-shot watch fires once more, unheard)."""
        with self._lock:
            watch = self._active.pop(target, None)
        if watch is not None:
            watch.active = False

    def rearm_all(self) -> None:
        """Arm every watch again (after a reconnect or a new session)."""
        with self._lock:
            watches = list(self._active.values())
        for watch in watches:
            watch.arm()

    def _path(self, target: Target) -> str:
        if target.kind is TargetKind.VALUE:
            return self._layout.anchor(target.name)
        if target.kind is TargetKind.KEYSET:
            return self._layout.directory(target.name)
        if target.kind is TargetKind.GROUP:
            return self._layout.members(target.name)
        return self._layout.queue(target.name)
