"""Keeping one-shot ZooKeeper watches armed for every watched target.

Each target maps to one znode: a value to its anchor (data watch, set with
``exists`` so that it also fires on creation), a namespace, group or
election to its parent znode (child watch; an ``exists`` watch while that
znode is missing). After a watch fires, the request that arms it again is
sent and only *then* is the target reported changed, so the core's re-read
goes to the server after the re-arm (a session's requests are served in
order): a change either precedes that read or fires the new watch. The
report does not wait for the re-arm's reply, which saves the re-read a
round trip. A group's re-arm is a ``getChildren2`` handed to ``Groups.listed``:
its reply is the first read of the re-read. kazoo drops all watches when the connection breaks;
``rearm_all`` (called on every CONNECTED) arms them again and reports every
target once they are set.

Callbacks run on kazoo's threads and never block: they only send
asynchronous requests and call ``changed`` (which returns at once).
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError
from kazoo.protocol.states import EventType

from consensus_api.backend import Target, TargetKind
from consensus_backends.zookeeper.client import TRANSIENT
from consensus_backends.zookeeper.layout import Layout
from consensus_backends.zookeeper.membership import Groups

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
        *,
        listed: Callable[[Any], None] | None = None,
    ) -> None:
        self._client = client
        self._target = target
        self._path = path
        self._children = children
        self._changed = changed
        self._listed = listed
        self.active = True

    def arm(self, *, reported: bool = False) -> None:
        """Set the watch (again); the target is reported once it is set, unless ``reported``
        (then a group's re-arm, children and parent stat, goes to ``listed`` before the report)."""
        if not self.active:
            return
        done: Callable[[Any], object]
        if self._children:
            done = self._children_set_quietly if reported else self._children_set
            rearm = self._client.get_children_async(
                self._path, watch=self._fired, include_data=self._listed is not None
            )
            rearm.rawlink(done)
            if reported and self._listed is not None:
                self._listed(rearm)
        else:
            done = self._check if reported else self._set
            self._client.exists_async(self._path, watch=self._fired).rawlink(done)

    def _fired(self, event: Any) -> None:
        if self.active and event.type != EventType.NONE:  # NONE: the connection broke; rearm_all follows
            self.arm(reported=True)
            self._changed(self._target)  # sent after the re-arm: the re-read is served after it

    def _children_set_quietly(self, result: Any) -> None:
        if self.active and isinstance(result.exception, NoNodeError):
            self._children_set(result)  # the parent vanished: fall back to its exists watch
        else:
            self._check(result)

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
        if self.active and self._check(result):
            self._changed(self._target)

    def _check(self, result: Any) -> bool:
        """Whether the watch is set (or its znode is missing); logs other failures."""
        error = result.exception
        if error is None or isinstance(error, NoNodeError):
            return True
        if self.active and not isinstance(error, TRANSIENT):
            log.warning("cannot watch %s in ZooKeeper: %s", self._target, type(error).__name__)
        return False


class Watches:
    """The armed watches of one backend."""

    def __init__(
        self, client: KazooClient, layout: Layout, changed: Callable[[Target], None], groups: Groups
    ) -> None:
        self._client = client
        self._layout = layout
        self._changed = changed
        self._groups = groups
        self._lock = threading.Lock()
        self._active: dict[Target, _Watch] = {}

    def watch(self, target: Target) -> None:
        """Start watching ``target``; returns at once."""
        with self._lock:
            if target in self._active:
                return
            listed = None
            if target.kind is TargetKind.GROUP:
                self._groups.watch(target.name)
                listed = functools.partial(self._groups.listed, target.name)
            watch = self._active[target] = _Watch(
                self._client,
                target,
                self._path(target),
                target.kind is not TargetKind.VALUE,
                self._changed,
                listed=listed,
            )
        watch.arm()

    def unwatch(self, target: Target) -> None:
        """Stop reporting ``target`` (a pending one-shot watch fires once more, unheard)."""
        with self._lock:
            watch = self._active.pop(target, None)
        if watch is not None:
            watch.active = False
            if target.kind is TargetKind.GROUP:
                self._groups.forget(target.name)

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
            return self._layout.roster(target.name)
        return self._layout.queue(target.name)
