"""The runner's handle on its chaos client processes: spawn, kill, pause, respawn, talk.

A slot is one logical client. Killing a slot's process (SIGKILL) respawns the
slot at once under a new spawn number, so its operations continue under new
history processes; the kill time is kept for the outstanding operation's
``info`` row. Each process is a child of the harness (:mod:`consensus_api.children`):
it reads commands on stdin and reports on stdout (see
``consensus_chaos.record.client_process``), and is signalled by PID only.
"""

from __future__ import annotations

import json
import random
import threading
import time
from pathlib import Path
from typing import Any

from consensus_api.children import Child, close_all


class ClientProcess(Child):
    """One OS process of a slot."""

    def __init__(self, slot: int, spawn: int, module: str, args: list[str], *, lifetime: float, url: str,
                 log: Path) -> None:  # fmt: skip
        super().__init__(module, args, lifetime=lifetime, url=url, name=f"chaos-client-{spawn}", log=log)
        self.slot = slot
        self.spawn = spawn

    @property
    def identity(self) -> dict[str, Any] | None:
        """What names its session on the server, as it last said (``SESSION <JSON>``)."""
        for line in reversed(self.lines_from()):
            if line.startswith("SESSION "):
                found: dict[str, Any] = json.loads(line.partition(" ")[2])
                return found
        return None

    def wait_said(self, word: str, deadline: float) -> bool:
        """True once the process said ``word``; False if it ended first or at ``deadline``."""
        said = self.wait_line(lambda line: line.split()[:1] == [word], deadline - time.monotonic())
        return said is not None


class Clients:
    """All client processes of a run, by slot."""

    def __init__(  # noqa: PLR0917
        self, module: str, args: list[str], lifetime: float, url: str, workdir: Path, rng: random.Random
    ) -> None:
        """Clients ``python -m module *args`` (with their slot, spawn, journal and seed), living
        ``lifetime`` seconds at most, their URL ``url``."""
        self._module = module
        self._args = args
        self._lifetime = lifetime
        self._url = url
        self._workdir = workdir
        self._rng = rng
        self._lock = threading.RLock()
        self._by_slot: dict[int, ClientProcess] = {}
        self._offsets: dict[Path, int] = {}
        self._ops = 0
        self.spawns = 0
        self.kill_ns: dict[int, int] = {}
        self.logs: list[Path] = []

    def start(self, slot: int) -> ClientProcess:
        """Start a new process for ``slot`` under the next spawn number."""
        with self._lock:
            spawn = self.spawns
            self.spawns += 1
            journal = self._workdir / f"client-{slot}-{spawn}.jsonl"
            log = self._workdir / f"client-{slot}-{spawn}.log"
            flags = {"client": slot, "spawn": spawn, "journal": journal, "seed": self._rng.randrange(2**31)}
            args = [
                *self._args,
                *(part for flag, value in flags.items() for part in (f"--{flag}", str(value))),
            ]
            self.logs.append(log)
            self._by_slot[slot] = ClientProcess(
                slot, spawn, self._module, args, lifetime=self._lifetime, url=self._url, log=log
            )
            return self._by_slot[slot]

    def slots(self) -> list[int]:
        with self._lock:
            return sorted(self._by_slot)

    def kill(self, slot: int) -> str:
        """SIGKILL the slot's process, reap it and respawn the slot; returns a description."""
        with self._lock:
            old = self._by_slot[slot]
            self.kill_ns[old.spawn] = time.monotonic_ns()
            old.close()
            new = self.start(slot)
        return f"pid {old.pid} spawn {old.spawn} killed; spawn {new.spawn} started"

    def pause(self, slot: int) -> str:
        with self._lock:
            target = self._by_slot[slot]
        target.pause()
        return f"pid {target.pid} spawn {target.spawn}"

    def resume(self, slot: int) -> None:
        with self._lock:
            self._by_slot[slot].resume()

    def fault_identity(self, slot: int) -> dict[str, Any] | None:
        with self._lock:
            return self._by_slot[slot].identity

    def respawn_exited(self) -> None:
        """Start a new process for every slot whose process ended on its own (reaped)."""
        with self._lock:
            for slot, proc in list(self._by_slot.items()):
                if proc.returncode is not None:
                    self.kill_ns.setdefault(proc.spawn, time.monotonic_ns())
                    proc.close()
                    self.start(slot)

    def send_all(self, line: str) -> None:
        with self._lock:
            for proc in self._by_slot.values():
                proc.resume()
                proc.send(line)

    def wait_all(self, word: str, timeout: float) -> list[int]:
        """Wait until every process said ``word``; the slots that did not in time."""
        deadline = time.monotonic() + timeout
        with self._lock:
            procs = list(self._by_slot.values())
        return [proc.slot for proc in procs if not proc.wait_said(word, deadline)]

    def kill_all(self) -> None:
        """SIGKILL every process still running (their open operations become ``info``) and reap all."""
        with self._lock:
            for proc in self._by_slot.values():
                if proc.returncode is None:
                    self.kill_ns[proc.spawn] = time.monotonic_ns()
            close_all(self._by_slot.values())

    def count_ops(self) -> int:
        """Operations invoked so far, counted from the journals' new complete lines."""
        for journal in self._workdir.glob("client-*.jsonl"):
            offset = self._offsets.get(journal, 0)
            with journal.open("rb") as handle:
                handle.seek(offset)
                chunk = handle.read()
            cut = chunk.rfind(b"\n") + 1
            self._ops += chunk[:cut].count(b'"type":"invoke"')
            self._offsets[journal] = offset + cut
        return self._ops

    def keep_logs(self, path: Path) -> None:
        """Concatenate the non-empty client logs into ``path`` (nothing if all are empty)."""
        parts = [(log, log.read_text(errors="replace")) for log in self.logs if log.exists()]
        text = "".join(f"== {log.stem}\n{body}" for log, body in parts if body.strip())
        if text:
            path.write_text(text)
