"""Fault injection for chaos runs, one fault at a time, each recorded in the history.

Every fault heals itself before the next one starts: a paused process is
continued, a killed server is started again, a killed client is respawned
under a new spawn (hence new history processes). Each fault is an ``invoke``
row when it starts and an ``ok`` row once healed (``kind = "nemesis"``,
process -1), ``value`` naming the target. All waits are bounded; ``stop``
cuts a hold time short.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from consensus_chaos.record.journal import Journal
from consensus_chaos.record.schema import INVOKE, NEMESIS, OK
from consensus_testkit.cluster import ClusterHandle

if TYPE_CHECKING:
    from consensus_testkit import ServerHandle

FAULTS = ("kill", "pause", "restart", "expire", "leader-kill", "leader-pause", "partition")
SERVER_FAULTS = frozenset({"restart"})
#: Faults of one node of a replicated cluster (``consensus chaos --server NAME --nodes 3``).
CLUSTER_FAULTS = frozenset({"leader-kill", "leader-pause", "partition"})
PAUSE_RANGE = (0.5, 3.0)
DOWN_RANGE = (0.5, 2.0)
SERVER_READY_TIMEOUT = 60.0


class ClientControl(Protocol):
    """What the nemesis needs from the runner's client processes."""

    def slots(self) -> list[int]: ...

    def kill(self, slot: int) -> str: ...

    def pause(self, slot: int) -> str: ...

    def resume(self, slot: int) -> None: ...

    def fault_identity(self, slot: int) -> Mapping[str, Any] | None: ...


class Nemesis:
    """Applies random faults from ``faults`` until ``stop`` is set; see the module docstring."""

    def __init__(
        self,
        faults: frozenset[str],
        clients: ClientControl,
        *,
        server: ServerHandle | ClusterHandle | None,
        expire_session: Callable[[Mapping[str, Any]], None] | None,
        session_timeout: float,
        journal: Journal,
        rng: random.Random,
    ) -> None:
        self.faults = sorted(faults)
        self.clients = clients
        self.server = server
        self.expire_session = expire_session
        self.session_timeout = session_timeout
        self.journal = journal
        self.rng = rng
        self.stop = threading.Event()
        self.applied: dict[str, int] = {}
        self.errors: list[str] = []
        self._seq = 0

    def run(self, interval: float) -> None:
        """Apply a fault about every ``interval`` seconds until ``stop``."""
        while self.faults and not self.stop.wait(self.rng.uniform(0.5, 1.5) * interval):
            self.apply(self.rng.choice(self.faults))

    def apply(self, fault: str) -> None:
        """Inject one fault and heal it."""
        on_server = self.server is not None and (fault in SERVER_FAULTS or self.rng.random() < 0.5)
        if fault == "expire":
            self._expire()
        elif fault in CLUSTER_FAULTS:
            self._record(f"{fault}-node", "server node", lambda: self._node_fault(fault))
        elif on_server and fault == "kill":
            self._record("kill-server", "server", self._kill_server)
        elif on_server and fault == "pause":
            self._record("pause-server", "server", self._pause_server)
        elif on_server and fault == "restart":
            self._record("restart-server", "server", self._restart_server)
        elif fault in ("kill", "pause"):
            slot = self.rng.choice(self.clients.slots())
            if fault == "kill":
                self._record("kill-client", f"client {slot}", lambda: self.clients.kill(slot))
            else:
                self._record("pause-client", f"client {slot}", lambda: self._pause_client(slot, PAUSE_RANGE))

    def _record(self, name: str, target: str, action: Callable[[], object]) -> None:
        """Run ``action`` between an ``invoke`` and an ``ok`` row; a failure is kept in ``errors``."""
        self._seq += 1
        record = {"kind": NEMESIS, "f": name, "seq": self._seq, "value": target}
        self.journal.write({**record, "type": INVOKE})
        try:
            detail = action()
        except Exception as exc:
            detail = f"failed: {type(exc).__name__}: {exc}"
            self.errors.append(f"{name} {target}: {detail}")
        done = {**record, "type": OK}
        if isinstance(detail, str):
            done["value"] = f"{target}: {detail}"
        self.journal.write(done)
        self.applied[name] = self.applied.get(name, 0) + 1

    def _hold(self, low_high: tuple[float, float]) -> None:
        self.stop.wait(self.rng.uniform(*low_high))

    def _kill_server(self) -> None:
        assert self.server is not None
        self.server.kill()
        self._hold(DOWN_RANGE)
        self.server.spawn()
        self.server.wait_ready(SERVER_READY_TIMEOUT)

    def _pause_server(self) -> None:
        assert self.server is not None
        self.server.pause()
        try:
            self._hold(PAUSE_RANGE)
        finally:
            self.server.resume()

    def _restart_server(self) -> None:
        assert self.server is not None
        self.server.restart(SERVER_READY_TIMEOUT)

    def _node_fault(self, fault: str) -> str:
        """On a cluster: kill or pause the leading node, or partition a follower from the others; held
        for a while, then healed, and the cluster serving again (every node back)."""
        cluster = self.server
        assert isinstance(cluster, ClusterHandle), "cluster faults need a cluster (--nodes 3)"
        leader = cluster.wait_leader(SERVER_READY_TIMEOUT)
        node = leader if fault != "partition" else self.rng.choice([n for n in cluster.ids if n != leader])
        if fault == "leader-kill":
            cluster.kill(node)
            self._hold(DOWN_RANGE)
            cluster.spawn(node)
        elif fault == "leader-pause":
            cluster.pause(node)
            try:
                self._hold(PAUSE_RANGE)
            finally:
                cluster.resume(node)
        else:
            cluster.isolate(node)
            try:
                self._hold(PAUSE_RANGE)
            finally:
                cluster.heal(node)
        cluster.wait_ready(SERVER_READY_TIMEOUT)
        return f"node {node}"

    def _pause_client(self, slot: int, low_high: tuple[float, float]) -> str:
        detail = self.clients.pause(slot)
        try:
            self._hold(low_high)
        finally:
            self.clients.resume(slot)
        return detail

    def _expire(self) -> None:
        """A real server-side expiry (``expire_session``) of a client's current session when it has
        one; otherwise (no expirer, or no server-side session right now) the client paused past its
        session timeout."""
        slot = self.rng.choice(self.clients.slots())
        identity = self.clients.fault_identity(slot)
        expire = self.expire_session
        if (
            expire is not None
            and identity
            and all(value not in (None, [], "") for value in identity.values())
        ):
            self._record("expire-session", f"client {slot} on the server", lambda: expire(identity))
            return
        hold = self.session_timeout * 1.5 + 0.5
        self._record(
            "expire-session",
            f"client {slot} paused {hold:.1f}s",
            lambda: self._pause_client(slot, (hold, hold)),
        )
