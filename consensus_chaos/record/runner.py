"""The chaos runner: client processes, a nemesis, and the history they leave in Parquet.

``run_chaos`` starts the server when asked, runs ``clients`` client processes
(``consensus_chaos.record.client_process``) for ``duration`` seconds while the nemesis
injects faults, then stops the workload, waits until dead sessions have
expired, lets every live client record its ``final`` reads, and converts the
journals into ``<out>/<run>.parquet``. Every wait is bounded; every process
it started is gone when it returns.

A cutover run (``workload="cutover"``) has a new store too (``migrate_to`` or
``migrate_server``): the clients connect bridged (``$CONSENSUS_MIGRATE_TO``),
the migration driver (``consensus_chaos.record.migration``) follows the run's
keys onto the new store, cuts over at ``cutover_at`` of the workload and reads
the new store's counters at the end; the nemesis restarts the new store's
server (the old one's when the new store is a SQLite file).
"""

from __future__ import annotations

import contextlib
import os
import random
import secrets
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from consensus_api.config import parse_url
from consensus_api.errors import BackendUnavailableError, ConfigurationError
from consensus_api.session import connect
from consensus_chaos.record.client_process import LOG_LEVELS
from consensus_chaos.record.client_slots import Clients
from consensus_chaos.record.convert import collect, summarize, write_history
from consensus_chaos.record.cutover import ENV_MIGRATE_TO
from consensus_chaos.record.journal import Journal
from consensus_chaos.record.migration import MigrationDriver
from consensus_chaos.record.nemesis import CLUSTER_FAULTS, FAULTS, SERVER_FAULTS, Nemesis
from consensus_chaos.record.schema import MIGRATION_PROCESS, NEMESIS_PROCESS
from consensus_chaos.record.workload import SETTLE_MAX, TEAM_SIZE
from consensus_testkit import (
    DatabaseFile,
    launcher,
    require_launchers,
    start_cluster,
    start_store,
    store_names,
)
from consensus_testkit.profile import SessionExpirer, profile_for

if TYPE_CHECKING:
    from consensus_testkit import ServerHandle
    from consensus_testkit.cluster import ClusterHandle

#: The client process of each workload: storage, elections and groups; a resource group; locks; or
#: counters, an election and a lock on bridged sessions across a migration's cut-over.
WORKLOADS = {
    "storage": "consensus_chaos.record.client_process",
    "coordinator": "consensus_chaos.record.ownership",
    "locks": "consensus_chaos.record.locks",
    "cutover": "consensus_chaos.record.cutover",
}
STOP_TIMEOUT_MARGIN = 5.0
READY_TIMEOUT = 60.0
EXPIRE_TIMEOUT = 10.0
#: Seconds the midway step (the cut-over) may run past the workload's end.
MIDWAY_GRACE = 30.0

Progress = Callable[[float, int, int], None]


@dataclass(frozen=True, slots=True)
class ChaosOptions:
    """What to run; see ``consensus chaos --help`` for the meaning of each field."""

    url: str | None
    server: str | None
    duration: float
    clients: int
    keys: int
    faults: frozenset[str]
    out: Path
    session_timeout: float = 2.0
    request_timeout: float = 3.0
    key_period: float = 2.0
    fault_interval: float = 2.0
    think: float = 0.005
    workload: str = "storage"
    nodes: int = 1
    seed: int = field(default_factory=lambda: secrets.randbelow(2**31))
    log_level: str = "INFO"
    #: The cutover workload's new store: a URL, or a server this command starts.
    migrate_to: str | None = None
    migrate_server: str | None = None
    #: When the cut-over starts, as a fraction of ``duration``.
    cutover_at: float = 0.5

    def validate(self) -> None:
        """``ConfigurationError`` for options that cannot work together."""
        if (self.url is None) == (self.server is None):
            raise ConfigurationError("give either a URL or --server NAME (which starts the server)")
        if self.server is not None and self.server not in store_names():
            raise ConfigurationError(
                f"unknown server {self.server!r}; expected one of {', '.join(store_names())}"
            )
        if self.workload not in WORKLOADS:
            raise ConfigurationError(
                f"unknown workload {self.workload!r}; expected one of {', '.join(WORKLOADS)}"
            )
        if self.log_level not in LOG_LEVELS:
            raise ConfigurationError(
                f"unknown log level {self.log_level!r}; expected one of {', '.join(LOG_LEVELS)}"
            )
        unknown = self.faults - set(FAULTS)
        if unknown:
            raise ConfigurationError(
                f"unknown faults {sorted(unknown)}; expected none or {', '.join(FAULTS)}"
            )
        if self.server is not None:
            require_launchers((self.server,))  # its dependencies, before anything starts
        clusters = self.server not in (None, "sqlite") and launcher(str(self.server)).cluster is not None
        if self.nodes > 1 and (not clusters or self.nodes % 2 == 0 or self.nodes < 3):
            raise ConfigurationError(
                "--nodes needs an odd number, at least 3, and a --server whose launcher starts clusters"
            )
        if self.faults & CLUSTER_FAULTS and self.nodes == 1:
            raise ConfigurationError(
                f"--faults {','.join(sorted(self.faults & CLUSTER_FAULTS))} need --nodes 3"
            )
        if self.faults & SERVER_FAULTS and self.server in (None, "sqlite") and self.workload != "cutover":
            raise ConfigurationError("--faults restart needs a server this command controls: --server NAME")
        self._validate_cutover()
        teams = -(-self.clients // TEAM_SIZE)
        if self.workload == "storage" and self.keys < teams:
            raise ConfigurationError(
                f"--keys must be at least {teams} so that at most {TEAM_SIZE} clients share a key"
            )

    def _validate_cutover(self) -> None:
        migrating = (self.migrate_to, self.migrate_server) != (None, None)
        if self.workload != "cutover":
            if migrating:
                raise ConfigurationError("--migrate-to and --migrate-server go with --workload cutover")
            return
        if (self.migrate_to is not None and self.migrate_server is not None) or not migrating:
            raise ConfigurationError(
                "--workload cutover needs the new store: --migrate-to URL or --migrate-server NAME"
            )
        if self.migrate_server is not None:
            require_launchers((self.migrate_server,))
        if not 0 < self.cutover_at < 1:
            raise ConfigurationError(f"--cutover-at must be between 0 and 1, not {self.cutover_at}")
        if "expire" in self.faults or self.faults & CLUSTER_FAULTS:
            raise ConfigurationError("--workload cutover takes the faults kill, pause and restart")
        if self.faults & SERVER_FAULTS and {self.server, self.migrate_server} <= {None, "sqlite"}:
            raise ConfigurationError("--faults restart needs a server this command controls (not SQLite)")


@dataclass(frozen=True, slots=True)
class ChaosResult:
    """What a run produced: the history file and counts for a summary."""

    run: str
    backend: str
    path: Path
    seconds: float
    counts: dict[str, int]
    faults: dict[str, int]
    fault_errors: list[str]
    spawns: int


class _Server:
    """The server a run controls (``consensus_testkit``): a real one, or a fresh database file."""

    def __init__(self, name: str, workdir: Path, nodes: int = 1) -> None:
        try:
            self.store = start_cluster(name, nodes, workdir) if nodes > 1 else start_store(name, workdir)
        except RuntimeError as exc:  # the server's log tail is in the message
            raise BackendUnavailableError(f"could not start {name}: {exc}") from exc
        self.url = self.store.url
        #: The server process (or cluster), for the server faults; None for a database file.
        self.handle: ServerHandle | ClusterHandle | None = (
            None if isinstance(self.store, DatabaseFile) else self.store
        )

    def stop(self) -> None:
        self.store.stop()


def _probe(url: str, options: ChaosOptions) -> str:
    """The backend's name; fails early (``ConfigurationError``, ``BackendUnavailableError``) on a bad URL."""
    with connect(url, connect_timeout=max(5.0, options.request_timeout)) as session:
        return session.backend


def _expirer(url: str, expire: SessionExpirer) -> Callable[[Mapping[str, Any]], None]:
    """``expire(identity)``: end the session ``identity`` names on the server at ``url``."""
    parsed = parse_url(url)[0]
    return lambda identity: expire(parsed, identity, EXPIRE_TIMEOUT)


def _client_lifetime(options: ChaosOptions) -> float:
    """How long a client process may live: the whole run, with every phase's bound."""
    return options.duration + 4 * options.session_timeout + 8 * options.request_timeout + 60


def _client_args(options: ChaosOptions, run: str) -> list[str]:
    """The flags of a client process, without its slot, spawn, journal, seed and lifetime."""
    flags = {
        "prefix": f"chaos/{run}",
        "clients": options.clients,
        "keys": options.keys,
        "t0-ns": time.monotonic_ns(),
        "key-period": options.key_period,
        "session-timeout": options.session_timeout,
        "request-timeout": options.request_timeout,
        "think": options.think,
        "log-level": options.log_level,
    }
    return [part for flag, value in flags.items() for part in (f"--{flag}", str(value))]


def _drive(
    options: ChaosOptions,
    clients: Clients,
    nemesis: Nemesis,
    progress: Progress | None,
    midway: Callable[[float], None] | None = None,
) -> None:
    """The run's phases: clients up, workload under faults (``midway(deadline)`` started on a thread
    at ``cutover_at`` of it), stop, expiry of dead sessions, final reads."""
    nemesis_thread = threading.Thread(target=nemesis.run, args=(options.fault_interval,), daemon=True)
    midway_thread: threading.Thread | None = None
    for slot in range(options.clients):
        clients.start(slot)
    clients.wait_all("READY", READY_TIMEOUT + options.request_timeout)  # the clock starts when they work
    started = time.monotonic()
    nemesis_thread.start()
    end = started + options.duration
    while (now := time.monotonic()) < end:
        if (
            midway is not None
            and midway_thread is None
            and now >= started + options.cutover_at * options.duration
        ):
            midway_thread = threading.Thread(target=midway, args=(end + MIDWAY_GRACE,), daemon=True)
            midway_thread.start()
        clients.respawn_exited()
        if progress is not None:
            progress(now - started, clients.count_ops(), sum(nemesis.applied.values()))
        time.sleep(min(0.25, max(0.0, end - now)))
    nemesis.stop.set()
    nemesis_thread.join(timeout=120)
    if midway_thread is not None:
        midway_thread.join(timeout=MIDWAY_GRACE + 60)
    clients.send_all("STOP")
    clients.wait_all("STOPPED", 2 * options.request_timeout + STOP_TIMEOUT_MARGIN)
    time.sleep(options.session_timeout * 4 / 3 + 1.0)  # dead sessions expire; views converge
    clients.send_all("FINAL")
    clients.wait_all("DONE", SETTLE_MAX + 6 * options.request_timeout + STOP_TIMEOUT_MARGIN)
    clients.send_all("EXIT")  # only now: closing a session changes what the others read
    clients.wait_all("BYE", 2 * options.request_timeout + STOP_TIMEOUT_MARGIN)
    if progress is not None:
        progress(time.monotonic() - started, clients.count_ops(), sum(nemesis.applied.values()))


@contextlib.contextmanager
def _exported(name: str, value: str | None) -> Iterator[None]:
    """``$name`` set to ``value`` (when not None) for the processes started meanwhile."""
    before = os.environ.get(name)
    if value is not None:
        os.environ[name] = value
    try:
        yield
    finally:
        if value is not None and before is None:
            os.environ.pop(name, None)
        elif value is not None and before is not None:
            os.environ[name] = before


def _migration(options: ChaosOptions, run: str, url: str, new_url: str, workdir: Path) -> MigrationDriver:
    """The driver of a cutover run, its keys created on the old store and its follower started."""
    journal = Journal(workdir / "migration.jsonl", MIGRATION_PROCESS, MIGRATION_PROCESS)
    settings = {"session_timeout": options.session_timeout, "request_timeout": options.request_timeout}
    driver = MigrationDriver(url, new_url, f"chaos/{run}", journal, settings)
    driver.prepare()
    driver.start_following()
    return driver


def _start_servers(options: ChaosOptions, workdir: Path, servers: list[_Server]) -> tuple[str, str | None]:
    """Start the servers ``options`` ask for, appended to ``servers`` as they start (the new store's
    last); the URLs of the store and of the new store (a cutover run's; None for the others)."""
    if options.server:
        servers.append(_Server(options.server, workdir, options.nodes))
    url = servers[0].url if servers else str(options.url)
    if options.migrate_server is None:
        return url, options.migrate_to
    (workdir / "new").mkdir()
    servers.append(_Server(options.migrate_server, workdir / "new"))
    return url, servers[-1].url


def run_chaos(options: ChaosOptions, progress: Progress | None = None) -> ChaosResult:
    """Run one chaos test and write its history; see the module docstring."""
    options.validate()
    run = time.strftime("%Y%m%dT%H%M%S") + "-" + secrets.token_hex(3)
    options.out.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix=f"chaos-{run}-"))
    servers: list[_Server] = []
    driver: MigrationDriver | None = None
    try:
        url, new_url = _start_servers(options, workdir, servers)
        backend = _probe(url, options)
        if new_url is not None:
            backend = f"{backend}->{_probe(new_url, options)}"
            driver = _migration(options, run, url, new_url, workdir)
        started = time.monotonic()
        rng = random.Random(options.seed)
        module, lifetime = WORKLOADS[options.workload], _client_lifetime(options)
        clients = Clients(module, _client_args(options, run), lifetime, url, workdir, rng)
        journal = Journal(workdir / "nemesis.jsonl", NEMESIS_PROCESS, NEMESIS_PROCESS)
        expire = profile_for(url).expire_session if driver is None else None
        handles = [server.handle for server in servers if server.handle is not None]
        nemesis = Nemesis(
            options.faults,
            clients,
            server=handles[-1] if handles else None,  # a cutover run's: the new store's, if it has one
            expire_session=_expirer(url, expire) if expire is not None else None,
            session_timeout=options.session_timeout,
            journal=journal,
            rng=rng,
        )
        try:
            with _exported(ENV_MIGRATE_TO, new_url):
                _drive(options, clients, nemesis, progress, None if driver is None else driver.cutover)
            if driver is not None:
                driver.stop_following()
                driver.record_final()
        finally:
            nemesis.stop.set()
            clients.kill_all()
            journal.close()
            if driver is not None:
                driver.stop_following()
                driver.journal.close()
        rows = collect(sorted(workdir.glob("*.jsonl")), run, backend, clients.kill_ns, time.monotonic_ns())
        path = options.out / f"{run}.parquet"
        write_history(rows, path)
        clients.keep_logs(options.out / f"{run}.log")
        seconds = time.monotonic() - started
        faults, errors = dict(nemesis.applied), list(nemesis.errors)
        return ChaosResult(run, backend, path, seconds, summarize(rows), faults, errors, clients.spawns)
    finally:
        for server in servers:
            server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
