"""What ``consensus demo`` knows and shows: state folded from the observer's events."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from rich.table import Table
from rich.text import Text

from consensus_api.cli._common import show_bytes
from consensus_api.cli.demo_worker import config_prefix
from consensus_api.model import Event, LeaderChanged, MembershipChanged, ValueChanged


@dataclass(frozen=True)
class Tenure:
    """A leader and its term, as the observer saw it."""

    leader: str
    term: int

    def __str__(self) -> str:
        return f"{self.leader} (term {self.term})"


@dataclass
class DemoState:
    """The observer's view, plus the kill and the hand-over it is waiting for."""

    started: float
    leader: Tenure | None = None
    members: dict[str, bytes] = field(default_factory=dict)
    config: bytes | None = None
    config_version: int | None = None
    killed: Tenure | None = None
    killed_at: float | None = None
    successor: Tenure | None = None
    handover_seconds: float | None = None
    successor_wrote_at: float | None = None

    def apply(self, event: Event, now: float) -> None:
        """Fold one observer event into the state."""
        if isinstance(event, LeaderChanged):
            self.leader = (
                None if event.leader_id is None or event.term is None else Tenure(event.leader_id, event.term)
            )
            self._check_handover(now)
        elif isinstance(event, MembershipChanged):
            self.members = dict(event.members)
        elif isinstance(event, ValueChanged) and event.version is not None:
            self.config, self.config_version = event.value, event.version
        if (
            self.successor is not None
            and self.successor_wrote_at is None
            and self.config is not None
            and self.config.startswith(config_prefix(self.successor.leader, self.successor.term))
        ):
            self.successor_wrote_at = now

    def _check_handover(self, now: float) -> None:
        if self.killed is None or self.successor is not None or self.leader is None or self.killed_at is None:
            return
        if self.leader.leader != self.killed.leader and self.leader.term > self.killed.term:
            self.successor = self.leader
            self.handover_seconds = now - self.killed_at

    def summary(self) -> str | None:
        """``hand-over: w1 (term 3) -> w2 (term 5) in 2.4 s`` once seen."""
        if self.killed is None or self.successor is None or self.handover_seconds is None:
            return None
        return f"hand-over: {self.killed} -> {self.successor} in {self.handover_seconds:.1f} s"

    def line(self) -> str:
        """The state as one plain line (for non-interactive output)."""
        leader = f"leader={self.leader.leader} term={self.leader.term}" if self.leader else "leader=none"
        members = ",".join(sorted(self.members)) or "-"
        config = "config=none"
        if self.config is not None:
            config = f"config={json.dumps(show_bytes(self.config))} version={self.config_version}"
        return f"{leader} members={members} {config}"

    def table(self, now: float) -> Table:
        """The state as a rich table (for a terminal)."""
        title = Text(f"consensus demo - {now - self.started:.1f} s")
        table = Table(title=title, title_justify="left", show_header=False)
        table.add_column("")
        table.add_column("")
        table.add_row("leader", Text(self.leader.leader, style="bold green") if self.leader else Text("none"))
        table.add_row("term", str(self.leader.term) if self.leader else "-")
        table.add_row("members", Text(", ".join(sorted(self.members)) or "-"))
        config = Text("none") if self.config is None else Text(show_bytes(self.config))
        table.add_row("config", config)
        table.add_row("version", str(self.config_version) if self.config_version is not None else "-")
        if self.killed is not None:
            table.add_row("killed", Text(str(self.killed), style="red"))
        if (summary := self.summary()) is not None:
            table.add_row("hand-over", Text(summary.removeprefix("hand-over: "), style="bold"))
        return table
