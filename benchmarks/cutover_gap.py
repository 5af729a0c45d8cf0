"""The leadership gap at a migration's cut-over: how long a service has no leader that can write.

Each trial migrates a fresh pair of stores (an old and a new one; on one server, two namespaces, or
two SQLite files): two candidates on bridged sessions (``connect(OLD, migrate_to=NEW)``), the first
one leading on the old store and writing fenced by its leadership every ``WRITE_EVERY`` seconds;
then ``consensus_api.migrate.cutover(OLD, NEW)``. Bridged sessions move by themselves: the leader is
told ``LeaderChanged(None)``, the candidates re-nominate on the new store, and the new leader writes
fenced again. Measured per trial (``time.monotonic``, one process):

* the **write gap**: from the last fenced write the old store accepted to the first the new store
  accepted (what a fenced resource sees: no leader can write in between);
* the **election gap**: from the old leader's ``LeaderChanged(None)`` to the first leader elected on
  the new store (a ``LeaderChanged`` with a term above the floor the cut-over set).

Target: p99 of the write gap <= session_timeout + 1 s.

    .venv/bin/python -m benchmarks.cutover_gap [--pairs sqlite-sqlite,zookeeper-etcd] [--runs N]

starts the servers (``consensus_testkit``), runs N cut-overs per pair and writes
``benchmarks/results/cutover-<old>-<new>.json``; ``consensus bench URL --only cutover`` runs the
same trials between two namespaces of the server at URL (``run``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from benchmarks.core import Plan, Row, ms, within
from consensus_api import connect
from consensus_api.errors import ConsensusError
from consensus_api.migrate.cutover import cutover
from consensus_api.model import LeaderChanged, Leadership
from consensus_api.session import Session
from consensus_testkit import start_server

RESULTS = Path(__file__).resolve().parent / "results"
SESSION_TIMEOUT = 3.0
REQUEST_TIMEOUT = 3.0
#: Seconds between two fenced writes of a leader.
WRITE_EVERY = 0.01
#: Trials per run of ``consensus bench`` (``--quick``: fewer).
RUNS, QUICK_RUNS = 20, 5
#: Seconds a trial may take to see its first leader, and a write on the new store after the cut-over.
SETTLE = 30.0
MARGIN = 1.0
PAIRS = ("sqlite-sqlite", "zookeeper-etcd")


@dataclass
class Trial:
    """One cut-over's measurements (seconds), None where it was not seen."""

    write_gap: float | None
    election_gap: float | None


@dataclass
class _Candidate:
    """A bridged session, candidate ``name`` of ``service``, writing ``key`` fenced while it leads."""

    session: Session
    service: str
    key: str
    name: str
    events: list[tuple[float, str | None, int | None]] = field(default_factory=list)
    writes: list[tuple[float, str, int]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        election = self.session.election(self.service)
        election.add_listener(self._on_leader)
        election.nominate(self.name)
        threading.Thread(target=self._write_while_leading, daemon=True).start()

    def _on_leader(self, change: LeaderChanged) -> None:
        self.events.append((time.monotonic(), change.leader_id, change.term))

    def _write_while_leading(self) -> None:
        election = self.session.election(self.service)
        while not self.stop.wait(WRITE_EVERY):
            try:
                lead: Leadership | None = election.leadership()
                if lead is None or lead.leader_id != self.name:
                    continue
                before = self._authority()
                self.session.storage.update(self.key, b"x", fence=lead)
            except ConsensusError:
                continue
            if self._authority() == before:  # else it is not known which store took it
                self.writes.append((time.monotonic(), before, lead.term))

    def _authority(self) -> str:
        """The store the bridge sends calls to now: ``old`` or ``new``."""
        return str(getattr(self.session._backend, "authority", "old"))

    def close(self) -> None:
        self.stop.set()
        self.session.close()


def namespaced(url: str, name: str, workdir: Path) -> str:
    """A store of its own for ``name`` at the server ``url`` names: a SQLite file in ``workdir``,
    tables of its own on PostgreSQL and MariaDB, a namespace (URL path) elsewhere."""
    parts = urlsplit(url)
    if parts.scheme == "sqlite":
        return f"sqlite:///{workdir / name}.db"
    if parts.scheme in ("postgresql", "mariadb", "mysql"):
        return f"{url}{'&' if parts.query else '?'}table_prefix={name.replace('-', '_')}_"
    return urlunsplit(parts._replace(path=f"{parts.path.rstrip('/')}/{name}"))


def trial(old: str, new: str, name: str, session_timeout: float) -> Trial:
    """One cut-over from ``old`` to ``new`` with two candidates (module docstring)."""
    options = {"session_timeout": session_timeout, "request_timeout": REQUEST_TIMEOUT}
    service, key = f"cutbench/{name}", f"cutbench/{name}-fenced"
    with connect(old, **options) as session:
        session.storage.put(key, b"-")
    candidates: list[_Candidate] = []
    try:
        for index in range(2):
            bridged = connect(old, migrate_to=new, **options)
            candidates.append(_Candidate(bridged, service, key, f"c{index}"))
            candidates[-1].start()
        _wait(lambda: bool(_writes(candidates, "old")), SETTLE)
        began = time.monotonic()
        floor = cutover(old, new, force=True, timeout=SETTLE, options=options).floor
        _wait(lambda: bool(_writes(candidates, "new")), SETTLE)
        old_writes, new_writes = _writes(candidates, "old"), _writes(candidates, "new")
        events = sorted(event for candidate in candidates for event in candidate.events)
        deposed = next((at for at, leader, _ in events if at >= began and leader is None), None)
        elected = next(
            (at for at, leader, term in events if leader is not None and (term or 0) > floor), None
        )
        return Trial(
            min(new_writes) - max(old_writes) if old_writes and new_writes else None,
            elected - deposed if elected is not None and deposed is not None else None,
        )
    finally:
        for candidate in candidates:
            candidate.close()


def _writes(candidates: list[_Candidate], store: str) -> list[float]:
    return [at for candidate in candidates for at, where, _ in list(candidate.writes) if where == store]


def _wait(condition: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)


def measure(old_server: str, new_server: str, runs: int, session_timeout: float, prefix: str) -> list[Trial]:
    """``runs`` cut-overs, each between fresh namespaces of the servers at ``old_server`` and
    ``new_server`` (the same URL: two namespaces of one server)."""
    workdir = Path(tempfile.mkdtemp(prefix="cutover-gap-"))
    try:
        found = []
        for index in range(runs):
            old = namespaced(old_server, f"{prefix}-{index}-old", workdir)
            new = namespaced(new_server, f"{prefix}-{index}-new", workdir)
            found.append(trial(old, new, f"{prefix}-{index}", session_timeout))
        return found
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def row(trials: list[Trial], pair: str, session_timeout: float) -> Row:
    """``cutover.gap``: the write gap's p50/p99 against the target, the election gap beside it."""
    writes = [t.write_gap for t in trials if t.write_gap is not None]
    elections = [t.election_gap for t in trials if t.election_gap is not None]
    p99 = ms(writes, 99)
    return Row(
        "cutover.gap",
        ms(writes, 50),
        p99,
        target=f"p99 <= session_timeout + {MARGIN:g} s",
        holds=within(p99, (session_timeout + MARGIN) * 1000),
        note=f"{pair}: last fenced write accepted on the old store -> first on the new one",
        extra={
            "pair": pair,
            "samples": len(writes),
            "trials": len(trials),
            "session_timeout_s": session_timeout,
            "election_gap_p50_ms": ms(elections, 50),
            "election_gap_p99_ms": ms(elections, 99),
            "write_gap_max_ms": round(max(writes) * 1000, 3) if writes else None,
        },
    )


def run(url: str, backend: str, plan: Plan, run_id: str) -> list[Row]:
    """``consensus bench URL --only cutover``: cut-overs between two namespaces of the server at URL."""
    runs = QUICK_RUNS if plan.quick else RUNS
    trials = measure(url, url, runs, SESSION_TIMEOUT, f"cb{run_id}")
    return [row(trials, f"{backend}-{backend}", SESSION_TIMEOUT)]


def main(argv: list[str] | None = None) -> int:
    """Start each pair's servers, measure, print and write the JSON; 1 if a target does not hold."""
    parser = argparse.ArgumentParser(prog="benchmarks.cutover_gap", description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", default=",".join(PAIRS), help=f"comma-separated OLD-NEW (default {PAIRS})")
    parser.add_argument("--runs", type=int, default=RUNS)
    parser.add_argument("--session-timeout", type=float, default=SESSION_TIMEOUT)
    args = parser.parse_args(argv)
    status = 0
    for pair in args.pairs.split(","):
        old_name, new_name = pair.split("-")
        servers = {name: start_server(name) for name in {old_name, new_name} - {"sqlite"}}
        urls = {name: server.url for name, server in servers.items()} | {"sqlite": "sqlite:///"}
        try:
            began = time.monotonic()
            trials = measure(
                urls[old_name], urls[new_name], args.runs, args.session_timeout, f"g{int(began)}"
            )
            result = row(trials, pair, args.session_timeout).as_json()
        finally:
            for server in servers.values():
                server.stop()
        result["elapsed_s"] = round(time.monotonic() - began, 1)
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / f"cutover-{pair}.json").write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps(result))
        status = max(status, 0 if result["holds"] else 1)
    return status


if __name__ == "__main__":
    sys.exit(main())
