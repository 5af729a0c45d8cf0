"""The runner's handle on its chaos client processes: spawn, kill, pause, respawn, talk.

A slot is one logical client. Killing a slot's process (SIGKILL) respawns the
slot at once under a new spawn number, so its operations continue under new
history processes; the kill time is kept for the outstanding operation's
``info`` row. Each process reads commands on stdin and reports on stdout
(see ``consensus_chaos.record.client_process``). Processes are signalled by PID only.
"""

from __future__ import annotations

import contextlib
import json
import random
import signal
import subprocess
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

EXIT_WAIT = 5.0


class ClientProcess:
    """One OS process of a slot, with a thread that reads its report lines."""

    def __init__(self, slot: int, spawn: int, process: subprocess.Popen[str]) -> None:
        self.slot = slot
        self.spawn = spawn
        self.process = process
        self.identity: dict[str, Any] | None = None
        self.said: set[str] = set()
        self.changed = threading.Condition()
        threading.Thread(target=self._read, name=f"chaos-client-{spawn}", daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            words = line.split()
            if words[:1] == ["SESSION"]:
                self.identity = json.loads(line.partition(" ")[2])
            elif words:
                with self.changed:
                    self.said.add(words[0])
                    self.changed.notify_all()
        with self.changed:
            self.said.add("EOF")
            self.changed.notify_all()

    def send(self, line: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            assert self.process.stdin is not None
            self.process.stdin.write(line + "\n")
            self.process.stdin.flush()

    def wait_said(self, word: str, deadline: float) -> bool:
        """True once the process said ``word``; False if it ended first or at ``deadline``."""
        with self.changed:
            while word not in self.said and "EOF" not in self.said:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.changed.wait(left)
            return word in self.said

    def signal(self, sig: int) -> None:
        """Send ``sig``, unless the process has ended (its PID may name another process by now)."""
        self.process.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL (continuing it first if paused) and reap, bounded."""
        self.signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(EXIT_WAIT)


class Clients:
    """All client processes of a run, by slot."""

    def __init__(
        self, base_args: list[str], env: Mapping[str, str], workdir: Path, rng: random.Random
    ) -> None:
        self._base_args = base_args
        self._env = dict(env)
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
            args = [
                *self._base_args,
                "--client",
                str(slot),
                "--spawn",
                str(spawn),
                "--journal",
                str(journal),
                "--seed",
                str(self._rng.randrange(2**31)),
            ]
            with log.open("w") as err:
                process = subprocess.Popen(
                    args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True, env=self._env
                )
            self.logs.append(log)
            self._by_slot[slot] = ClientProcess(slot, spawn, process)
            return self._by_slot[slot]

    def slots(self) -> list[int]:
        with self._lock:
            return sorted(self._by_slot)

    def kill(self, slot: int) -> str:
        """SIGKILL the slot's process and respawn the slot; returns a description."""
        with self._lock:
            old = self._by_slot[slot]
            self.kill_ns[old.spawn] = time.monotonic_ns()
            old.kill()
            new = self.start(slot)
        return f"pid {old.process.pid} spawn {old.spawn} killed; spawn {new.spawn} started"

    def pause(self, slot: int) -> str:
        with self._lock:
            target = self._by_slot[slot]
        target.signal(signal.SIGSTOP)
        return f"pid {target.process.pid} spawn {target.spawn}"

    def resume(self, slot: int) -> None:
        with self._lock:
            self._by_slot[slot].signal(signal.SIGCONT)

    def fault_identity(self, slot: int) -> dict[str, Any] | None:
        with self._lock:
            return self._by_slot[slot].identity

    def respawn_exited(self) -> None:
        """Start a new process for every slot whose process ended on its own."""
        with self._lock:
            for slot, proc in list(self._by_slot.items()):
                if proc.process.poll() is not None:
                    self.kill_ns.setdefault(proc.spawn, time.monotonic_ns())
                    self.start(slot)

    def send_all(self, line: str) -> None:
        with self._lock:
            for proc in self._by_slot.values():
                proc.signal(signal.SIGCONT)
                proc.send(line)

    def wait_all(self, word: str, timeout: float) -> list[int]:
        """Wait until every process said ``word``; the slots that did not in time."""
        deadline = time.monotonic() + timeout
        with self._lock:
            procs = list(self._by_slot.values())
        return [proc.slot for proc in procs if not proc.wait_said(word, deadline)]

    def kill_all(self) -> None:
        """SIGKILL every process still running (their open operations become ``info``)."""
        with self._lock:
            for proc in self._by_slot.values():
                if proc.process.poll() is None:
                    self.kill_ns[proc.spawn] = time.monotonic_ns()
                    proc.kill()
                with contextlib.suppress(OSError):
                    if proc.process.stdin is not None:
                        proc.process.stdin.close()

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
