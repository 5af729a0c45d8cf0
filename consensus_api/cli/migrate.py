"""``consensus migrate``: copy the keys under a prefix to another backend, follow changes, verify;
its sub-commands ``cutover``, ``rollback`` and ``status`` run a bridged migration
(``consensus_api.cli.migrate_bridge``).

Exit status: 0 done; 1 differences found (``--verify``), paths the target
cannot hold, or a target that already holds other data (refused without
``--overwrite``); 2 usage, configuration or an unreachable backend; 130
interrupted (run the same command again to resume). See docs/migration.md.
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time

import click
from rich.progress import BarColumn, Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.text import Text

from consensus_api.cli._common import (
    EXIT_FAILURE,
    err_console,
    expand_url,
    out_console,
    print_error,
    show_text,
)
from consensus_api.cli.migrate_bridge import cutover, rollback, status
from consensus_api.migrate import Action, Migration, Report

EXIT_INTERRUPTED = 130

#: Conflicting keys listed by name.
SHOWN = 20


@click.group("migrate", invoke_without_command=True, subcommand_metavar="[cutover|rollback|status]")
@click.option("--from", "source", metavar="URL", help="The backend to copy from (required).")
@click.option("--to", "target", metavar="URL", help="The backend to copy to (required).")
@click.option(
    "--prefix", default="", metavar="NS", help="Only this key and the keys below it (default: all)."
)
@click.option("--raw", is_flag=True, help="The source is any ZooKeeper tree: znodes map to keys by path.")
@click.option(
    "--follow", is_flag=True, help="After the copy, keep copying changes until interrupted (Ctrl-C)."
)
@click.option(
    "--verify", is_flag=True, help="Only compare source and target; exit 1 listing the differences."
)
@click.option("--dry-run", is_flag=True, help="List what the copy would do; write nothing.")
@click.option(
    "--overwrite",
    is_flag=True,
    help="Make the target's prefix a copy of the source's, replacing "
    "(and deleting) data the migration did not write.",
)
@click.option(
    "--rescan-interval",
    type=click.FloatRange(min=0.1),
    default=30.0,
    show_default=True,
    help="With --follow: seconds between full rescans of the source (finds keys in new namespaces).",
)
@click.pass_context
def migrate(  # noqa: PLR0917 - click passes every option as a parameter
    ctx: click.Context,
    source: str | None,
    target: str | None,
    prefix: str,
    raw: bool,
    follow: bool,
    verify: bool,
    dry_run: bool,
    overwrite: bool,
    rescan_interval: float,
) -> None:
    """Copy every key under --prefix from --from to --to, values byte for byte.

    Re-running resumes: nothing is duplicated and no value someone else wrote
    to the target is overwritten. Members, candidates and leaders are not
    copied: clients re-join on the new backend, or move by themselves when they
    run bridged (connect with migrate_to) and an operator runs `consensus
    migrate cutover` (docs/migration.md).
    """
    if ctx.invoked_subcommand is not None:
        if source is not None or target is not None:
            raise click.UsageError(f"give --from and --to after '{ctx.invoked_subcommand}'")
        return
    if source is None or target is None:
        raise click.UsageError("Missing option '--from' or '--to'.")
    if verify and (follow or dry_run or overwrite):
        raise click.UsageError(
            "--verify only compares: it cannot be combined with --follow, --dry-run or --overwrite"
        )
    if follow and dry_run:
        raise click.UsageError("--follow cannot be combined with --dry-run")
    source_url, target_url = expand_url(source) or source, expand_url(target) or target
    previous = signal.signal(signal.SIGTERM, _interrupt)  # a service manager's stop ends it like Ctrl-C
    try:
        with Migration(source_url, target_url, prefix=prefix, raw=raw) as migration:
            if verify:
                with _Bar() as bar:
                    _verify(migration.verify(progress=bar.update))
                return
            report = _copy(migration, overwrite=overwrite, dry_run=dry_run)
            if follow:
                _follow(migration, report, rescan_interval)
    finally:
        signal.signal(signal.SIGTERM, previous)
    _finish(report)


for _command in (cutover, rollback, status):
    migrate.add_command(_command)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _copy(migration: Migration, *, overwrite: bool, dry_run: bool) -> Report:
    started = time.monotonic()
    with _Bar() as bar:
        try:
            report = migration.copy(overwrite=overwrite, dry_run=dry_run, progress=bar.update)
        except KeyboardInterrupt:
            bar.stop()
            print_error("interrupted: run the same command again to resume")
            raise click.exceptions.Exit(EXIT_INTERRUPTED) from None
    _summary(report, time.monotonic() - started)
    return report


def _follow(migration: Migration, report: Report, rescan_interval: float) -> None:
    console = err_console()
    console.print("following changes; press Ctrl-C to stop", style="bold")
    with _Bar(follow=True) as bar, contextlib.suppress(KeyboardInterrupt):  # Ctrl-C is how following ends
        migration.follow(
            threading.Event(), progress=bar.update, rescan_interval=rescan_interval, report=report
        )
    if report.pending:
        message = f"stopped following: {_counts(report)}; {report.pending} reported changes not applied yet"
    else:
        message = f"stopped following, in sync: {_counts(report)}"
    console.print(message, soft_wrap=True)


def _verify(report: Report) -> None:
    out = out_console()
    for difference in report.differences:
        line = f"{difference.kind:<10} {difference.key}  ({difference.detail})"
        out.print(Text(show_text(line)), soft_wrap=True)
    if report.differences:
        print_error(
            f"{len(report.differences)} differences between source and target ({report.scanned} source keys)"
        )
        raise click.exceptions.Exit(EXIT_FAILURE)
    out.print(f"source and target are equal ({report.scanned} keys)", soft_wrap=True)


def _summary(report: Report, elapsed: float) -> None:
    out = out_console()
    if report.dry_run:
        for action, key in report.planned:
            if action is not Action.UNCHANGED:
                out.print(Text(f"{action.value:<10} {show_text(key)}"), soft_wrap=True)
    rate = report.scanned / elapsed if elapsed > 0 else 0.0
    verb = "would copy" if report.dry_run else "copied"
    out.print(
        f"{verb}: {_counts(report)} ({report.scanned} source keys in {elapsed:.1f} s, {rate:.0f} keys/s)",
        soft_wrap=True,
    )


def _finish(report: Report) -> None:
    console = err_console()
    if report.conflicts:
        names = ", ".join(show_text(name) for name in report.conflicts[:SHOWN]) + (
            " ..." if len(report.conflicts) > SHOWN else ""
        )
        what = "would refuse" if report.dry_run else "left alone"
        console.print(
            Text(
                f"{what}: {len(report.conflicts)} target keys hold values "
                f"the migration did not write: {names}",
                style="yellow",
            ),
            soft_wrap=True,
        )
    for path, reason in report.unholdable:
        print_error(f"cannot copy {path!r}: {reason}")
    if report.unholdable:
        print_error(
            f"{len(report.unholdable)} source paths are keys the target cannot hold; they were not copied"
        )
    if report.unholdable or (report.dry_run and report.conflicts):
        raise click.exceptions.Exit(EXIT_FAILURE)


def _counts(report: Report) -> str:
    return ", ".join(f"{report.counts[action]} {action.value}" for action in Action)


class _Bar:
    """A rich progress display on stderr: counts while copying, pending changes while following."""

    def __init__(self, *, follow: bool = False) -> None:
        self._follow = follow
        console = err_console()
        self._progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[counts]}"),
            TimeElapsedColumn(),
            console=console,
            transient=True,
            disable=not console.is_terminal,
        )
        self._task: TaskID | None = None
        self._last = 0.0

    def __enter__(self) -> _Bar:
        self._progress.start()
        self._task = self._progress.add_task(
            "following" if self._follow else "scanning", total=None, counts=""
        )
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._progress.stop()

    def update(self, report: Report) -> None:
        now = time.monotonic()
        if now - self._last < 0.1 or self._task is None:
            return
        self._last = now
        if report.phase == "follow":
            state = "in sync" if report.pending == 0 else f"{report.pending} pending"
            description, counts = (
                f"following ({state})",
                f"{report.written} written, {len(report.conflicts)} left alone",
            )
        else:
            description = f"{report.phase}: {report.scanned} keys"
            counts = (
                f"{len(report.differences)} differences"
                if report.phase == "verify"
                else ", ".join(f"{report.counts[a]} {a.value}" for a in Action if report.counts[a])
            )
        self._progress.update(self._task, description=description, counts=counts)
