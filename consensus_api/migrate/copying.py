"""The copy, follow and verify of a migration (the package docstring states the guarantees)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from consensus_api.errors import (
    BackendUnavailableError,
    ConfigurationError,
    ConsensusError,
    InvalidKeyError,
    ValueTooLargeError,
)
from consensus_api.keys import check_key, check_namespace, check_value
from consensus_api.marker import announce
from consensus_api.migrate.copier import ABSENT, Action, Copier, Item, TargetState
from consensus_api.migrate.follower import Follower
from consensus_api.migrate.ledger import LEDGER, Digest, Ledger, digest, reserved
from consensus_api.migrate.readahead import ReadAhead
from consensus_api.migrate.source import SessionSource, Source, open_source
from consensus_api.model import Versioned
from consensus_api.session import Session, connect

#: Source entries per batch (one ledger record each).
BATCH = 256

#: Writes the copy keeps running while it reads and decides the next batch.
WINDOW = 2 * BATCH

#: Conflicting keys named in a ``MigrationConflictError`` message.
SHOWN = 10


class MigrationConflictError(ConsensusError):
    """The target already holds different data under the prefix; nothing was written."""

    def __init__(self, conflicts: list[str]) -> None:
        self.conflicts = conflicts
        shown = ", ".join(repr(key) for key in conflicts[:SHOWN])
        more = f" and {len(conflicts) - SHOWN} more" if len(conflicts) > SHOWN else ""
        super().__init__(
            f"the target already holds {len(conflicts)} keys that differ from the source: {shown}{more}; "
            "nothing was written (overwrite=True / --overwrite makes the target a copy of the source)"
        )


@dataclass(frozen=True, slots=True)
class Difference:
    """One way source and target differ: ``missing`` (source only), ``extra`` (target only),
    ``differs`` (both, other bytes) or ``unholdable`` (a source path the target cannot hold)."""

    key: str
    kind: str
    detail: str = ""


@dataclass
class Report:
    """What a run did (or would do, in a dry run); updated live and handed to ``progress``."""

    phase: str = "copy"
    dry_run: bool = False
    scanned: int = 0
    counts: dict[Action, int] = field(default_factory=lambda: dict.fromkeys(Action, 0))
    conflicts: list[str] = field(default_factory=list)
    unholdable: list[tuple[str, str]] = field(default_factory=list)
    differences: list[Difference] = field(default_factory=list)
    planned: list[tuple[Action, str]] = field(default_factory=list)
    pending: int = 0

    @property
    def written(self) -> int:
        """Keys created, updated or deleted on the target."""
        return sum(self.counts[action] for action in (Action.CREATE, Action.UPDATE, Action.DELETE))

    @property
    def ok(self) -> bool:
        """No path was left behind for lack of a valid key, and verify found no difference."""
        return not self.unholdable and not self.differences


Progress = Callable[[Report], None]


def unholdable(path: str, value: bytes | None) -> str | None:
    """Why the target cannot hold ``path`` with ``value``, or None if it can."""
    try:
        check_key(path)
        if value is not None:
            check_value(value)
    except (InvalidKeyError, ValueTooLargeError) as exc:
        return str(exc)
    if reserved(path):
        return f"{path} is reserved for the migration's own records"
    return None


class Migration:
    """An open source and target; ``copy``, ``follow`` and ``verify`` run against them."""

    def __init__(
        self,
        source_url: str,
        target_url: str,
        *,
        prefix: str = "",
        raw: bool = False,
        workers: int = 16,
        options: Mapping[str, Any] | None = None,
    ) -> None:
        """Connect to both; ``BackendUnavailableError`` names the side that cannot be reached."""
        self.prefix = check_namespace(prefix)
        if reserved(self.prefix):
            raise ConfigurationError(f"{LEDGER} is the migration's ledger; it cannot be migrated")
        self._workers = workers
        settings = dict(options or {})
        self.source: Source = _opened("source", lambda: open_source(source_url, raw=raw, options=settings))
        try:
            self.target: Session = _opened("target", lambda: connect(target_url, **settings))
        except BaseException:
            self.source.close()
            raise
        self._copied: dict[str, Digest] = {}

    def close(self) -> None:
        """Disconnect from both."""
        try:
            self.source.close()
        finally:
            self.target.close()

    def __enter__(self) -> Migration:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def copy(
        self, *, overwrite: bool = False, dry_run: bool = False, progress: Progress | None = None
    ) -> Report:
        """Bring the target's prefix in line with the source's (see the module docstring)."""
        report = Report(dry_run=dry_run)
        ledger = Ledger(self.target.storage)
        ledger.load()
        targets = {key: TargetState(digest(found.value), found.version) for key, found in self._target_keys()}
        copier = Copier(
            self.target.storage, ledger, overwrite=overwrite, dry_run=dry_run, workers=self._workers
        )

        def done(key: str, action: Action) -> None:
            report.counts[action] += 1
            if action is Action.CONFLICT:
                report.conflicts.append(key)
            if dry_run:
                report.planned.append((action, key))
            if progress is not None:
                progress(report)

        try:
            resuming = any(ledger.known(key) for key in targets)
            if not (overwrite or resuming):
                self._refuse_conflicts(copier, ledger, targets, dry_run)
            with ReadAhead(self.source.walk(self.prefix), BATCH) as pages:
                for page in pages:
                    batch: list[Item] = []
                    for path, value in page:
                        report.scanned += 1
                        reason = unholdable(path, value)
                        if reason is not None:
                            report.unholdable.append((path, reason))
                            continue
                        self._copied[path] = digest(value)
                        batch.append(Item(path, value))
                    states = {item.key: targets.pop(item.key, ABSENT) for item in batch}
                    copier.apply(batch, states, done, window=WINDOW)
            copier.finish()
            gone = list(targets)  # only in the target: deleted if the migration wrote them
            for start in range(0, len(gone), BATCH):
                part = [Item(key, None) for key in gone[start : start + BATCH]]
                self._copied.update(dict.fromkeys(gone[start : start + BATCH]))
                copier.apply(part, {item.key: targets[item.key] for item in part}, done)
        finally:
            copier.close()
        return report

    def follow(
        self,
        stop: threading.Event,
        *,
        progress: Progress | None = None,
        rescan_interval: float = 30.0,
        report: Report | None = None,
    ) -> Report:
        """Copy every change of the source until ``stop`` is set; run after ``copy``.

        Target values the migration did not write are never overwritten
        (counted in ``report.conflicts``): once clients write to the target,
        their values win.
        """
        report = report or Report()
        report.phase = "follow"
        if isinstance(self.source, SessionSource):  # a cut-over counts a follower as a bridged client
            announce(self.source.session._backend, role="follower")
        ledger = Ledger(self.target.storage)
        ledger.load()
        copier = Copier(self.target.storage, ledger, overwrite=False, dry_run=False, workers=self._workers)

        def apply(items: list[Item]) -> None:
            holdable = []
            for item in items:
                report.scanned += 1
                reason = unholdable(item.key, item.value)
                if reason is None:
                    holdable.append(item)
                elif (item.key, reason) not in report.unholdable:
                    report.unholdable.append((item.key, reason))
            states = copier.gather(copier.state, [item.key for item in holdable])
            copier.apply(holdable, states, lambda key, action: _count(report, key, action))

        def idle(pending: int) -> None:
            report.pending = pending
            if progress is not None:
                progress(report)

        follower = Follower(
            self.source, copier, self.prefix, self._copied, apply, rescan_interval=rescan_interval, idle=idle
        )
        try:
            follower.run(stop)
        finally:
            copier.close()
        return report

    def verify(self, *, progress: Progress | None = None) -> Report:
        """Compare source and target key by key (presence and bytes); writes nothing."""
        report = Report(phase="verify")
        targets = {key: digest(found.value) for key, found in self._target_keys()}
        for path, value in self.source.walk(self.prefix):
            report.scanned += 1
            reason = unholdable(path, value)
            found = targets.pop(path, None)
            if reason is not None:
                report.differences.append(Difference(path, "unholdable", reason))
            elif found is None:
                report.differences.append(Difference(path, "missing", "in the source, not in the target"))
            elif found != digest(value):
                report.differences.append(Difference(path, "differs", "the values differ"))
            if progress is not None:
                progress(report)
        for key in targets:
            report.differences.append(Difference(key, "extra", "in the target, not in the source"))
        report.differences.sort(key=lambda difference: difference.key)
        return report

    def _target_keys(self) -> Iterator[tuple[str, Versioned]]:
        storage = self.target.storage
        if self.prefix:
            found = storage.fetch(self.prefix)
            if found is not None:
                yield self.prefix, found
        for key, found in storage.walk(self.prefix):
            if not reserved(key):
                yield key, found

    def _refuse_conflicts(
        self, copier: Copier, ledger: Ledger, targets: dict[str, TargetState], dry_run: bool
    ) -> None:
        """``MigrationConflictError`` if the target holds, under the prefix, values not the source's."""
        foreign = [key for key, state in targets.items() if not ledger.owns(key, state.digest)]
        sources = copier.gather(self.source.fetch, foreign)
        conflicts = sorted(key for key in foreign if digest(sources[key]) != targets[key].digest)
        if conflicts and not dry_run:
            raise MigrationConflictError(conflicts)


def migrate(
    source_url: str,
    target_url: str,
    *,
    prefix: str = "",
    raw: bool = False,
    follow: bool = False,
    verify: bool = False,
    dry_run: bool = False,
    overwrite: bool = False,
    progress: Progress | None = None,
    stop: threading.Event | None = None,
    rescan_interval: float = 30.0,
    options: Mapping[str, Any] | None = None,
) -> Report:
    """Copy (then, with ``follow``, keep copying until ``stop`` is set), or with ``verify`` only compare.

    ``dry_run`` lists what a copy would do (``Report.planned``) and writes
    nothing. ``options`` (e.g. ``request_timeout``) apply to both sessions.
    See the module docstring for the guarantees.
    """
    if verify and (follow or dry_run or overwrite):
        raise ConfigurationError(
            "verify only compares: it cannot be combined with follow, dry_run or overwrite"
        )
    if follow and dry_run:
        raise ConfigurationError("follow cannot be combined with dry_run")
    with Migration(source_url, target_url, prefix=prefix, raw=raw, options=options) as migration:
        if verify:
            return migration.verify(progress=progress)
        report = migration.copy(overwrite=overwrite, dry_run=dry_run, progress=progress)
        if follow:
            migration.follow(
                stop or threading.Event(), progress=progress, rescan_interval=rescan_interval, report=report
            )
        return report


def _count(report: Report, key: str, action: Action) -> None:
    report.counts[action] += 1
    if action is Action.CONFLICT:
        report.conflicts.append(key)


def _opened(side: str, opener: Callable[[], Any]) -> Any:
    """Run ``opener``; a ``BackendUnavailableError`` says which side could not be reached."""
    try:
        return opener()
    except BackendUnavailableError as exc:
        raise BackendUnavailableError(f"the {side} is unreachable: {exc}") from None
