"""``consensus conformance``: run the contract suite (docs/spec.md section 10) in-process against a URL."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import click
from rich.table import Table
from rich.text import Text

from consensus_api.cli._common import EXIT_FAILURE, err_console, out_console, resolved_url
from consensus_api.errors import ConfigurationError
from consensus_api.session import connect
from consensus_testkit.conformance import SECTIONS

if TYPE_CHECKING:
    import pytest

SUITE = "consensus_testkit.conformance"
#: The plugin module itself: this module imported the package already (SECTIONS), too late for pytest to
#: rewrite its assertions, which ``-p consensus_testkit.conformance`` would warn about.
PLUGIN = "consensus_testkit.conformance.plugin"
EXTRA = "conformance"
KINDS = ("passed", "failed", "skipped")
_RANK = {"passed": 0, "skipped": 1, "failed": 2}


@dataclass
class Section:
    """Counts and time of one section (one ``test_<section>.py`` module)."""

    passed: int = 0
    failed: int = 0
    skipped: int = 0
    not_applicable: int = 0
    seconds: float = 0.0


@dataclass(eq=False)  # hashed by identity: pytest keeps plugins in sets (e.g. when a conftest is loaded)
class Collector:
    """A pytest plugin that records the outcome of every test by section.

    A test's outcome is the worst of its phases: an error in setup or
    teardown counts as failed, a skip in setup as skipped. A module that
    fails to import counts as one failed test of its section. Tests the
    plugin did not collect because they do not apply to the backend are
    counted as ``not_applicable``, with the reason (only what the backend's test profile declares).
    """

    outcomes: dict[str, str] = field(default_factory=dict)
    sections_of: dict[str, str] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    messages: dict[str, str] = field(default_factory=dict)
    not_applicable: dict[str, str] = field(default_factory=dict)

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        from consensus_testkit.conformance.plugin import NOT_APPLICABLE  # noqa: PLC0415 - imports pytest

        reasons: dict[str, str] = session.config.stash.get(NOT_APPLICABLE, {})
        self.not_applicable = dict(reasons)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self._record(report.nodeid, report.outcome, report.duration, report)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.outcome != "passed":
            self._record(report.nodeid or "<collection>", report.outcome, 0.0, report)

    def _record(self, nodeid: str, outcome: str, duration: float, report: Any) -> None:
        section = section_of(nodeid)
        self.sections_of[nodeid] = section
        self.seconds[section] = self.seconds.get(section, 0.0) + (duration or 0.0)
        previous = self.outcomes.get(nodeid, "passed")
        if nodeid not in self.outcomes or _RANK[outcome] > _RANK[previous]:
            self.outcomes[nodeid] = outcome
        if outcome != "passed" and nodeid not in self.messages:
            self.messages[nodeid] = _first_line(report.longrepr)

    def sections(self) -> dict[str, Section]:
        """Counts per section, sorted by name."""
        result: dict[str, Section] = {}
        for nodeid, outcome in self.outcomes.items():
            section = result.setdefault(self.sections_of[nodeid], Section())
            setattr(section, outcome, getattr(section, outcome) + 1)
        for nodeid in self.not_applicable:
            result.setdefault(section_of(nodeid), Section()).not_applicable += 1
        for name, seconds in self.seconds.items():
            result.setdefault(name, Section()).seconds = seconds
        return dict(sorted(result.items()))

    def not_applicable_list(self) -> list[dict[str, str]]:
        """Every test that did not apply: ``{"test": node id, "reason": why}``, in collection order."""
        return [{"test": nodeid, "reason": reason} for nodeid, reason in self.not_applicable.items()]

    def reasons(self) -> dict[str, int]:
        """How many tests did not apply, per reason."""
        return dict(sorted(Counter(self.not_applicable.values()).items()))

    def failed_ids(self) -> list[str]:
        """The ids of every failed test (and broken module), in order."""
        return self.ids("failed")

    def ids(self, outcome: str) -> list[str]:
        """The ids of every test with ``outcome``, in order."""
        return [nodeid for nodeid, seen in self.outcomes.items() if seen == outcome]


def _first_line(longrepr: Any) -> str:
    """The gist of a failure or skip: the crash message or the skip reason."""
    if isinstance(longrepr, tuple) and len(longrepr) == 3:  # a skip: (path, line, reason)
        text = str(longrepr[2])
    else:
        crash = getattr(longrepr, "reprcrash", None)
        text = getattr(crash, "message", None) or str(longrepr or "")
    return text.strip().splitlines()[0] if text.strip() else ""


def section_of(nodeid: str) -> str:
    """``.../test_storage.py::test_x[param]`` -> ``storage``; ``test_faults_netns.py`` -> ``faults``."""
    module = nodeid.split("::", 1)[0].rstrip("/").rsplit("/", 1)[-1]
    name = module.removesuffix(".py").removeprefix("test_") or module
    return next((section for section in SECTIONS if name.startswith(f"{section}_")), name)


def run_suite(url: str, select: str | None, quiet: bool) -> tuple[int, Collector]:
    """Run the suite against ``url``; pytest's output goes to stderr when ``quiet``."""
    args = [
        "-p",
        PLUGIN,
        "--pyargs",
        SUITE,
        f"--consensus-url={url}",
        "-p",
        "no:cacheprovider",
        "-q",
        "--tb=short",
        "--continue-on-collection-errors",
    ]  # a module that cannot import is one failure, not the end
    if select:
        args += ["-k", select]
    import pytest  # noqa: PLC0415 - imported only when the suite runs: it is slow to import

    collector = Collector()
    target = sys.stderr if quiet else sys.stdout
    with contextlib.redirect_stdout(target):
        code = pytest.main(args, plugins=[collector])
    return int(code), collector


@click.command("conformance")
@click.argument("url", required=False)
@click.option(
    "--url", "url_option", metavar="URL", default=None, help="The backend URL (instead of the URL argument)."
)
@click.option("--json", "as_json", is_flag=True, help="Print only a JSON summary on stdout.")
@click.option("-k", "select", metavar="EXPR", default=None, help="Only tests matching EXPR (pytest -k).")
def conformance(url: str | None, url_option: str | None, as_json: bool, select: str | None) -> None:
    """Run the conformance suite against URL and report per section.

    URL may reference environment variables ('$CONSENSUS_URL'); without a URL the
    default resolution applies. Exit 1 if any test failed or was skipped, or none ran.
    Tests the backend's test profile declares not applicable (e.g. server faults
    on SQLite, which has no server process) are not run and are listed with the
    reason; any other reason a test cannot run is a failure. The fault tests find
    the server's control file in $CONSENSUS_CONTROL, which `consensus servers run`
    sets. Needs pytest (the 'conformance' extra).
    """
    if url is not None and url_option is not None:
        raise click.UsageError("give the URL either as argument or with --url, not both")
    if importlib.util.find_spec("pytest") is None:
        raise ConfigurationError(f"the conformance suite needs pytest: pip install 'consensus-api[{EXTRA}]'")
    full_url = resolved_url(url if url is not None else url_option)
    with connect(full_url) as session:
        backend = session.backend
    code, collector = run_suite(full_url, select, quiet=as_json)
    sections = collector.sections()
    totals = {kind: sum(getattr(s, kind) for s in sections.values()) for kind in KINDS}
    if as_json:
        summary = {
            "backend": backend,
            **totals,
            "not_applicable": collector.not_applicable_list(),
            "sections": {
                name: {
                    "passed": s.passed,
                    "failed": s.failed,
                    "skipped": s.skipped,
                    "not_applicable": s.not_applicable,
                    "seconds": round(s.seconds, 1),
                }
                for name, s in sections.items()
            },
        }
        click.echo(json.dumps(summary))
    else:
        _print_report(backend, sections, totals, collector)
    ran = sum(totals.values())
    if ran == 0:
        err_console().print(Text(f"no conformance test ran (pytest exit code {code})", style="red"))
    if totals["failed"] or totals["skipped"] or ran == 0:
        sys.exit(EXIT_FAILURE)


def _print_report(
    backend: str, sections: dict[str, Section], totals: dict[str, int], collector: Collector
) -> None:
    table = Table(title=Text(f"conformance: {backend}"), title_justify="left")
    table.add_column("section")
    for column in ("passed", "failed", "skipped", "n/a", "time"):
        table.add_column(column, justify="right")
    for name, s in sections.items():
        table.add_row(
            Text(name),
            Text(str(s.passed), style="green" if s.passed else ""),
            Text(str(s.failed), style="red" if s.failed else ""),
            Text(str(s.skipped), style="yellow" if s.skipped else ""),
            Text(str(s.not_applicable), style="dim"),
            f"{s.seconds:.1f} s",
        )
    total_seconds = sum(s.seconds for s in sections.values())
    not_applicable = sum(s.not_applicable for s in sections.values())
    table.add_section()
    table.add_row(
        "total", *(str(totals[kind]) for kind in KINDS), str(not_applicable), f"{total_seconds:.1f} s"
    )
    console = out_console()
    console.print(table)
    for outcome, style in (("failed", "red"), ("skipped", "yellow")):
        for nodeid in collector.ids(outcome):
            line = Text(f"{outcome.upper()} ", style=style)
            line.append(nodeid)
            if collector.messages.get(nodeid):
                line.append(f" - {collector.messages[nodeid]}", style="dim")
            console.print(line, soft_wrap=True)
    for reason, count in collector.reasons().items():
        console.print(Text(f"{count} test(s) not applicable: {reason}", style="dim"), soft_wrap=True)
