"""The members of watched tooz groups, kept current by this API's push events for ``run_watchers``."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from tooz import coordination

from consensus_api.model import MembershipChanged, ValueChanged
from consensus_api.session import Session
from consensus_api.tooz_driver._plumbing import group_exists, group_key, group_name


@dataclass
class _Watched:
    """One watched group: members as last reported by ``changes`` and as pushed since."""

    reported: frozenset[bytes]
    pushed: frozenset[bytes]
    exists: bool = True
    on_members: Callable[[MembershipChanged], None] = field(default=lambda _: None)
    on_key: Callable[[ValueChanged], None] = field(default=lambda _: None)


class GroupWatches:
    """Listeners on the members and the existence of every watched group. Thread-safe."""

    def __init__(self, session: Session) -> None:
        self._session = session
        self._mutex = threading.Lock()
        self._groups: dict[bytes, _Watched] = {}

    def watch(self, group_id: bytes) -> None:
        """Start watching ``group_id`` from its members now; ``GroupNotCreated`` if it does not exist."""
        if group_id in self._groups:
            return
        if not group_exists(self._session, group_id):
            raise coordination.GroupNotCreated(group_id)
        now = frozenset(
            bytes.fromhex(member) for member in self._session.group(group_name(group_id)).members()
        )
        watched = _Watched(now, now)

        def on_members(event: MembershipChanged) -> None:
            with self._mutex:
                watched.pushed = frozenset(bytes.fromhex(member) for member in event.members)

        def on_key(event: ValueChanged) -> None:
            with self._mutex:
                watched.exists = event.value is not None

        watched.on_members, watched.on_key = on_members, on_key
        with self._mutex:
            self._groups[group_id] = watched
        self._session.group(group_name(group_id)).add_listener(on_members)
        self._session.listeners.add_value_listener(group_key(group_id), on_key)

    def unwatch(self, group_id: bytes) -> None:
        """Stop watching ``group_id``."""
        with self._mutex:
            watched = self._groups.pop(group_id, None)
        if watched is not None:
            self._session.group(group_name(group_id)).remove_listener(watched.on_members)
            self._session.listeners.remove_value_listener(group_key(group_id), watched.on_key)

    def changes(self) -> list[tuple[bytes, frozenset[bytes], frozenset[bytes]]]:
        """For each watched group, the members that joined and left since the last call (a group that
        was deleted has no members)."""
        found = []
        with self._mutex:
            for group_id, watched in self._groups.items():
                current = watched.pushed if watched.exists else frozenset()
                joined, left = current - watched.reported, watched.reported - current
                watched.reported = current
                if joined or left:
                    found.append((group_id, joined, left))
        return found
