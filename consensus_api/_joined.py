"""What the application joined through one session: members (with their data) and candidacies.

A session counts its losses; each member ``("member", group, id)`` and
candidacy ``("candidacy", service, id)`` remembers the count when it was last
joined, so it is joined in the current session only if the two are equal.
After a loss the session joins again (with ``auto_rejoin``) everything joined
before it, except what was joined *once* (a lock's holders and queue), which a
loss voids for good.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from consensus_api.errors import ConsensusError, MemberExistsError

log = logging.getLogger("consensus_api")

Item = tuple[str, str, str]  # ("member", group, id) or ("candidacy", service, id)


class Joined:
    """The members and candidacies a session holds, guarded by the session's ``lock``."""

    def __init__(self, lock: threading.RLock) -> None:
        self._lock = lock
        self.losses = 0
        self._members: dict[tuple[str, str], bytes] = {}
        self._candidacies: set[tuple[str, str]] = set()
        self._joined_in: dict[Item, int] = {}
        self._once: set[Item] = set()

    def record(self, item: Item, data: bytes, losses: int, *, rejoin: bool, auto_rejoin: bool) -> bool:
        """Track ``item`` (a member's ``data``), joined while the session had ``losses`` losses.

        A loss that overtook the join voided it: with ``auto_rejoin`` (and ``rejoin``) it is
        tracked to be joined again like everything the loss voided (True: a rejoin is due), else
        it is forgotten.
        """
        kind, name, own_id = item
        with self._lock:
            overtaken = losses != self.losses
            if overtaken and not (rejoin and auto_rejoin):
                return False
            if kind == "member":
                self._members[(name, own_id)] = data
            else:
                self._candidacies.add((name, own_id))
            self._joined_in[item] = losses
            if not rejoin:
                self._once.add(item)
        return overtaken

    def forget(self, item: Item) -> None:
        """Stop tracking ``item`` (it left or resigned)."""
        kind, name, own_id = item
        with self._lock:
            if kind == "member":
                self._members.pop((name, own_id), None)
            else:
                self._candidacies.discard((name, own_id))
            self._joined_in.pop(item, None)
            self._once.discard(item)

    def holds(self, item: Item) -> bool:
        """Whether ``item`` is tracked."""
        kind, name, own_id = item
        with self._lock:
            if kind == "member":
                return (name, own_id) in self._members
            return (name, own_id) in self._candidacies

    def candidacies(self) -> set[tuple[str, str]]:
        """The tracked candidacies, as ``(service, candidate id)``."""
        with self._lock:
            return set(self._candidacies)

    def lost(self) -> None:
        """The session was lost (its lock held): what was joined is void until joined again."""
        self.losses += 1

    def clear(self) -> None:
        """Forget everything (the session closed, or was lost without ``auto_rejoin``)."""
        with self._lock:
            self._members.clear()
            self._candidacies.clear()
            self._joined_in.clear()
            self._once.clear()

    def due(self) -> tuple[dict[Item, bytes], list[Item]]:
        """Everything tracked: members with their data, then candidacies in order."""
        with self._lock:
            members = {("member", *key): data for key, data in self._members.items()}
            return members, [("candidacy", *key) for key in sorted(self._candidacies)]

    def redo(self, item: Item, call: Callable[[str, str], object]) -> bool:
        """Run ``call(name, id)`` unless ``item`` is no longer tracked, joined once or already joined
        in this session; False if it failed for a passing reason and should be retried."""
        with self._lock:
            losses = self.losses
            if not self.holds(item) or item in self._once or self._joined_in.get(item) == losses:
                return True
        _, name, own_id = item
        try:
            call(name, own_id)
            with self._lock:
                self._joined_in[item] = losses
        except MemberExistsError:
            log.warning("could not re-join %r to %r: another live session holds that id", own_id, name)
            self.forget(item)
        except ConsensusError as exc:
            log.info("re-joining %r to %r failed (%s); retrying", own_id, name, exc)
            return False
        return True
