"""The tooz coordination driver on one consensus-api session (see the package docstring)."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import tooz
from tooz import coordination, utils

from consensus_api.errors import (
    ConsensusError,
    KeyExistsError,
    KeyNotFoundError,
    MemberExistsError,
    NotAMemberError,
)
from consensus_api.session import Session, connect
from consensus_api.tooz_driver._lock import ConsensusLock
from consensus_api.tooz_driver._plumbing import (
    DEFAULT_TIMEOUT,
    GROUPS,
    Result,
    as_bytes,
    backend_url,
    group_exists,
    group_key,
    group_name,
    now,
    translated,
)
from consensus_api.tooz_driver._watch import GroupWatches

log = logging.getLogger("consensus_api.tooz")
T = TypeVar("T")

OVERRIDES = "_tooz/overrides"
Characteristics = coordination.Characteristics


class ConsensusDriver(coordination.CoordinationDriver):
    """tooz's coordination API on one consensus-api session."""

    CHARACTERISTICS = (
        Characteristics.DISTRIBUTED_ACROSS_THREADS,
        Characteristics.DISTRIBUTED_ACROSS_PROCESSES,
        Characteristics.DISTRIBUTED_ACROSS_HOSTS,
        Characteristics.LINEARIZABLE,
        Characteristics.SEQUENTIAL,
        Characteristics.SAME_VIEW_ACROSS_CLIENTS,
    )

    def __init__(self, member_id: bytes, parsed_url: Any, options: dict[str, Any]) -> None:
        super().__init__(member_id, parsed_url, options)
        self._member = as_bytes(member_id)
        self._url = backend_url(parsed_url)
        self._timeout = float(options.get("timeout", [DEFAULT_TIMEOUT])[-1])
        self._session: Session | None = None
        self._expired = False
        self._last_beat = time.monotonic()
        self._stopping = threading.Event()
        self._watches: GroupWatches | None = None
        self._announced: dict[bytes, int] = {}

    # Plumbing.

    def session(self) -> Session:
        """The open session; ``ToozConnectionError`` when not started or expired."""
        session = self._session
        if session is None or self._expired:
            reason = "expired: heartbeat() was not called within timeout" if self._expired else "not started"
            raise coordination.ToozConnectionError(f"the coordinator is {reason}")
        return session

    def _call(self, call: Callable[[], T]) -> Result[T]:
        try:
            with translated():
                return Result(call(), None)
        except tooz.ToozError as exc:
            return Result(None, exc)

    def _start(self) -> None:
        try:
            self._session = connect(self._url)
        except ConsensusError as exc:
            utils.raise_with_cause(coordination.ToozConnectionError, str(exc), cause=exc)
        self._expired = False
        self._last_beat = time.monotonic()
        self._stopping.clear()
        self._watches = GroupWatches(self._session)
        threading.Thread(target=self._watchdog, name="consensus-tooz-watchdog", daemon=True).start()
        with translated():
            for group_id in list(self._hooks_elected_leader):
                self._stand(group_id)
            for group_id in {*self._hooks_join_group, *self._hooks_leave_group}:
                with contextlib.suppress(coordination.GroupNotCreated):
                    self._watches.watch(group_id)

    def _stop(self) -> None:
        self._stopping.set()
        session, self._session = self._session, None
        self._watches = None
        self._announced.clear()
        if session is not None:
            session.close()

    def _watchdog(self) -> None:
        while not self._stopping.wait(min(1.0, self._timeout / 4)):
            if time.monotonic() - self._last_beat > self._timeout and not self._expired:
                log.warning(
                    "tooz coordinator %r missed its heartbeat for %.1fs: expired", self._member, self._timeout
                )
                self._expired = True
                if self._session is not None:
                    self._session.close()
                return

    def heartbeat(self) -> float:
        """Keep this coordinator alive for ``timeout`` more seconds; apply boot-outs."""
        self._last_beat = time.monotonic()
        self._apply_boot_outs()
        return self._timeout / 2

    # Groups.

    def _override_key(self, group_id: bytes, member: bytes) -> str:
        return f"{OVERRIDES}/{group_id.hex()}/{member.hex()}"

    def _members(self, group_id: bytes) -> dict[str, bytes]:
        if not group_exists(self.session(), group_id):
            raise coordination.GroupNotCreated(group_id)
        return self.session().group(group_name(group_id)).membership()

    def create_group(self, group_id: bytes) -> Result[None]:
        group_id = as_bytes(group_id)

        def create() -> None:
            try:
                self.session().storage.put(group_key(group_id), b"")
            except KeyExistsError:
                raise coordination.GroupAlreadyExist(group_id) from None

        return self._call(create)

    def get_groups(self) -> Result[list[bytes]]:
        def groups() -> list[bytes]:
            return [bytes.fromhex(key.rpartition("/")[2]) for key in self.session().storage.keys(GROUPS)]

        return self._call(groups)

    def join_group(self, group_id: bytes, capabilities: Any = None) -> Result[None]:
        group_id = as_bytes(group_id)

        def join() -> None:
            if not group_exists(self.session(), group_id):
                raise coordination.GroupNotCreated(group_id)
            session = self.session()
            with contextlib.suppress(KeyNotFoundError):
                session.storage.delete(self._override_key(group_id, self._member))
            data = utils.dumps({"capabilities": capabilities, "created_at": now()})
            try:
                session.group(group_name(group_id)).join(self._member.hex(), data)
            except MemberExistsError:
                raise coordination.MemberAlreadyExist(group_id, self._member) from None
            self._joined_groups.add(group_id)

        return self._call(join)

    def leave_group(self, group_id: bytes) -> Result[None]:
        group_id = as_bytes(group_id)
        return self._call(lambda: self._leave(group_id, boot_out=True))

    def _leave(self, group_id: bytes, *, boot_out: bool) -> None:
        session = self.session()
        try:
            session.group(group_name(group_id)).leave(self._member.hex())
        except NotAMemberError:
            if self._member.hex() not in self._members(group_id):
                raise coordination.MemberNotJoined(group_id, self._member) from None
            if boot_out:  # another coordinator with this member id holds it
                self._write_override(group_id, {"boot_out": True})
        self._joined_groups.discard(group_id)
        with contextlib.suppress(KeyNotFoundError):
            session.storage.delete(self._override_key(group_id, self._member))

    def _apply_boot_outs(self) -> None:
        if self._session is None or self._expired:
            return
        with translated():
            for group_id in list(self._joined_groups):
                if self._override(group_id, self._member).get("boot_out"):
                    with contextlib.suppress(tooz.ToozError):
                        self._leave(group_id, boot_out=False)

    def delete_group(self, group_id: bytes) -> Result[None]:
        group_id = as_bytes(group_id)

        def delete() -> None:
            if self._members(group_id):
                raise coordination.GroupNotEmpty(group_id)
            try:
                self.session().storage.delete(group_key(group_id))
            except KeyNotFoundError:
                raise coordination.GroupNotCreated(group_id) from None

        return self._call(delete)

    def get_members(self, group_id: bytes) -> Result[set[bytes]]:
        group_id = as_bytes(group_id)
        return self._call(lambda: {bytes.fromhex(member) for member in self._members(group_id)})

    def _override(self, group_id: bytes, member: bytes) -> dict[str, Any]:
        stored = self.session().storage.fetch(self._override_key(group_id, member))
        return {} if stored is None else dict(utils.loads(stored.value))

    def _write_override(self, group_id: bytes, changes: dict[str, Any]) -> None:
        storage, key = self.session().storage, self._override_key(group_id, self._member)
        while True:
            current = storage.fetch(key)
            merged = utils.dumps({**({} if current is None else utils.loads(current.value)), **changes})
            try:
                if current is None:
                    storage.put(key, merged)
                else:
                    storage.update(key, merged, version=current.version)
                return
            except ConsensusError:
                continue

    def _info(self, group_id: bytes, member: bytes, data: bytes) -> dict[str, Any]:
        joined = utils.loads(data)
        override = self._override(group_id, member)
        return {
            "capabilities": override.get("capabilities", joined["capabilities"]),
            "created_at": joined["created_at"],
            "updated_at": override.get("updated_at", joined["created_at"]),
        }

    def get_member_info(self, group_id: bytes, member_id: bytes) -> Result[dict[str, Any]]:
        group_id, member_id = as_bytes(group_id), as_bytes(member_id)

        def info() -> dict[str, Any]:
            data = self._members(group_id).get(member_id.hex())
            if data is None:
                raise coordination.MemberNotJoined(group_id, member_id)
            return self._info(group_id, member_id, data)

        return self._call(info)

    def get_member_capabilities(self, group_id: bytes, member_id: bytes) -> Result[Any]:
        info = self.get_member_info(group_id, member_id)
        return self._call(lambda: info.get()["capabilities"])

    def get_members_with_capabilities(self, group_id: bytes) -> Result[dict[bytes, Any]]:
        group_id = as_bytes(group_id)

        def members() -> dict[bytes, Any]:
            return {
                bytes.fromhex(member): self._info(group_id, bytes.fromhex(member), data)["capabilities"]
                for member, data in self._members(group_id).items()
            }

        return self._call(members)

    def update_capabilities(self, group_id: bytes, capabilities: Any) -> Result[None]:
        group_id = as_bytes(group_id)

        def update() -> None:
            if self._member.hex() not in self._members(group_id):
                raise coordination.MemberNotJoined(group_id, self._member)
            self._write_override(group_id, {"capabilities": capabilities, "updated_at": now()})

        return self._call(update)

    # Watchers and elections.

    def watch_join_group(self, group_id: bytes, callback: Any) -> None:
        self._watch(as_bytes(group_id))
        super().watch_join_group(as_bytes(group_id), callback)

    def watch_leave_group(self, group_id: bytes, callback: Any) -> None:
        self._watch(as_bytes(group_id))
        super().watch_leave_group(as_bytes(group_id), callback)

    def _watch(self, group_id: bytes) -> None:
        with translated():
            if self._watches is None:
                raise coordination.ToozConnectionError("the coordinator is not started")
            self._watches.watch(group_id)

    def unwatch_join_group(self, group_id: bytes, callback: Any) -> None:
        super().unwatch_join_group(as_bytes(group_id), callback)
        self._unwatch(as_bytes(group_id))

    def unwatch_leave_group(self, group_id: bytes, callback: Any) -> None:
        super().unwatch_leave_group(as_bytes(group_id), callback)
        self._unwatch(as_bytes(group_id))

    def _unwatch(self, group_id: bytes) -> None:
        if not self._has_hooks_for_group(group_id) and self._watches is not None:
            self._watches.unwatch(group_id)

    def watch_elected_as_leader(self, group_id: bytes, callback: Any) -> None:
        group_id = as_bytes(group_id)
        first = group_id not in self._hooks_elected_leader
        super().watch_elected_as_leader(group_id, callback)
        if first:
            with translated():
                self._stand(group_id)

    def unwatch_elected_as_leader(self, group_id: bytes, callback: Any) -> None:
        group_id = as_bytes(group_id)
        super().unwatch_elected_as_leader(group_id, callback)
        if group_id not in self._hooks_elected_leader:
            self._announced.pop(group_id, None)
            with translated(), contextlib.suppress(NotAMemberError):
                self.session().election(group_name(group_id)).resign(self._member.hex())

    def _stand(self, group_id: bytes) -> None:
        with contextlib.suppress(MemberExistsError):  # another coordinator with this member id stands
            self.session().election(group_name(group_id)).nominate(self._member.hex())

    def stand_down_group_leader(self, group_id: bytes) -> bool:
        """Resign if this coordinator leads ``group_id``, and queue again as a candidate."""
        group_id = as_bytes(group_id)
        with translated():
            election = self.session().election(group_name(group_id))
            if election.leader() != self._member.hex():
                return False
            election.resign(self._member.hex())
            self._announced.pop(group_id, None)
            if group_id in self._hooks_elected_leader:
                self._stand(group_id)
            return True

    def get_leader(self, group_id: bytes) -> Result[bytes | None]:  # type: ignore[override]  # tooz's hint omits None
        group_id = as_bytes(group_id)

        def leader() -> bytes | None:
            current = self.session().election(group_name(group_id)).leader()
            return None if current is None else bytes.fromhex(current)

        return self._call(leader)

    def run_watchers(self, timeout: float | None = None) -> list[Any]:
        """Run the hooks of every change pushed since the last run, boot-outs, and the leader hooks
        of groups this coordinator now leads."""
        self._apply_boot_outs()
        results: list[Any] = []
        if self._watches is not None:
            for group_id, joined, left in self._watches.changes():
                if group_id in self._joined_groups and self._member in left:
                    self._joined_groups.discard(group_id)
                for member in joined:
                    if (hooks := self._hooks_join_group.get(group_id)) is not None:
                        results.extend(hooks.run(coordination.MemberJoinedGroup(group_id, member)))
                for member in left:
                    if (hooks := self._hooks_leave_group.get(group_id)) is not None:
                        results.extend(hooks.run(coordination.MemberLeftGroup(group_id, member)))
        with translated():
            for group_id, hooks in list(self._hooks_elected_leader.items()):
                current = self.session().election(group_name(group_id)).leadership()
                if current is None or current.leader_id != self._member.hex():
                    continue
                if self._announced.get(group_id) != current.term:
                    self._announced[group_id] = current.term
                    results.extend(hooks.run(coordination.LeaderElected(group_id, self._member)))
        return results

    def get_lock(self, name: bytes) -> ConsensusLock:
        return ConsensusLock(self.session, as_bytes(name))
