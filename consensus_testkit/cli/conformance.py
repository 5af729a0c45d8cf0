"""``consensus conformance``: run the contract suite in-process against a URL.

Contract: <https://consensus-api.github.io/consensus-api/spec/#10-conformance>
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import click
import pytest
from rich.table import Table
from rich.text import Text

from consensus_api.cli._common import (
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_USAGE,
    err_console,
    out_console,
    resolved_url,
)
from consensus_api.config import redact_text
from consensus_api.session import connect
from consensus_testkit.conformance import SECTIONS
from consensus_testkit.conformance.stash import NOT_APPLICABLE

SUITE = "consensus_testkit.conformance"
#: The plugin module itself: this module imported the package already (SECTIONS), too late for pytest to
#: rewrite its assertions, which ``-p consensus_testkit.conformance`` would warn about.
PLUGIN = "consensus_testkit.conformance.plugin"
KINDS = ("passed", "failed", "skipped")
_RANK = {"passed": 0, "skipped": 1, "failed": 2}
#: Names a file the command also writes its JSON summary to (the one ``--json`` prints), whatever it prints.
REPORT_VARIABLE = "CONSENSUS_CONFORMANCE_REPORT"
#: The command's exit status when pytest stopped on an internal error (pytest's own code for it).
EXIT_INTERNAL_ERROR = 3


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
    A test counts as passed only when its body ran and every phase passed.
    A failed test is a *failure* when its test body failed, an *error* when its
    setup or teardown failed or its module did not import (pytest's words); a
    test may be both.
    """

    outcomes: dict[str, str] = field(default_factory=dict)
    sections_of: dict[str, str] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    messages: dict[str, str] = field(default_factory=dict)
    not_applicable: dict[str, str] = field(default_factory=dict)
    failures: dict[str, None] = field(default_factory=dict)  # ordered sets of node ids
    errors: dict[str, None] = field(default_factory=dict)

    def pytest_collection_finish(self, session: pytest.Session) -> None:
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
        when = getattr(report, "when", None)
        if outcome == "passed" and when != "call":
            return  # passed only once its body ran: not a test interrupted after its setup
        previous = self.outcomes.get(nodeid, "passed")
        if nodeid not in self.outcomes or _RANK[outcome] > _RANK[previous]:
            self.outcomes[nodeid] = outcome
        if outcome != "passed" and nodeid not in self.messages:
            self.messages[nodeid] = _first_line(report.longrepr)
        if outcome == "failed":
            (self.failures if when == "call" else self.errors)[nodeid] = None

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

    def listed(self, nodeids: Iterable[str]) -> list[dict[str, str]]:
        """``{"test": node id, "message": the gist of why}`` for each of ``nodeids``."""
        return [{"test": nodeid, "message": self.messages.get(nodeid, "")} for nodeid in nodeids]


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
    default resolution applies. Tests the backend's test profile declares not
    applicable (e.g. server faults on SQLite, which has no server process; the
    security section on a URL without tls_ca) are not run and are listed with
    the reason; any other reason a test cannot run is a failure. The fault tests
    find the server's control file in $CONSENSUS_CONTROL, which `consensus
    servers run` sets. Needs pytest (the 'conformance' extra).

    The JSON summary (printed by --json; written also to the file
    $CONSENSUS_CONFORMANCE_REPORT names, whatever is printed) holds the backend,
    the URL (password redacted), the counts, pytest's exit code, the failures (a
    test body failed), errors (a setup or teardown failed, a module did not
    import) and skips, each with its test id and a message, the tests not
    applicable with the reason, and counts per section.

    Exit status: 0 when every test that ran passed; 1 when a test failed, erred or
    was skipped, or none ran; 2 when interrupted (Ctrl-C) or on a usage error; 3
    on pytest's internal error. After 2 or 3 the counts are those of the tests
    that ran.
    """
    if url is not None and url_option is not None:
        raise click.UsageError("give the URL either as argument or with --url, not both")
    full_url = resolved_url(url if url is not None else url_option)
    with connect(full_url) as session:
        backend = session.backend
    code, collector = run_suite(full_url, select, quiet=as_json)
    sections = collector.sections()
    totals = {kind: sum(getattr(s, kind) for s in sections.values()) for kind in KINDS}
    summary = {
        "backend": backend,
        "url": redact_text(full_url),
        **totals,
        "pytest_exit_code": code,
        "failures": collector.listed(collector.failures),
        "errors": collector.listed(collector.errors),
        "skips": collector.listed(collector.ids("skipped")),
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
    report = os.environ.get(REPORT_VARIABLE)
    if report:
        with open(report, "w", encoding="utf-8") as file:
            json.dump(summary, file)
    if as_json:
        click.echo(json.dumps(summary))
    else:
        _print_report(backend, sections, totals, collector)
    status = exit_status(code, totals)
    if status != EXIT_OK and not (status == EXIT_FAILURE and (totals["failed"] or totals["skipped"])):
        ran = sum(totals.values())  # a status the tests listed do not explain
        counts = f"{ran} conformance tests ran" if ran else "no conformance test ran"
        what = "interrupted" if code == pytest.ExitCode.INTERRUPTED else f"pytest exit code {code}"
        err_console().print(Text(f"{counts} ({what})", style="red"))
    sys.exit(status)


def exit_status(pytest_code: int, totals: dict[str, int]) -> int:
    """The command's exit status, given pytest's exit code and the counts (see ``conformance``)."""
    if pytest_code in (pytest.ExitCode.INTERRUPTED, pytest.ExitCode.USAGE_ERROR):
        return EXIT_USAGE
    if pytest_code == pytest.ExitCode.INTERNAL_ERROR:
        return EXIT_INTERNAL_ERROR
    if pytest_code != pytest.ExitCode.OK or totals["failed"] or totals["skipped"] or not sum(totals.values()):
        return EXIT_FAILURE
    return EXIT_OK


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
            label = "ERROR" if nodeid in collector.errors and nodeid not in collector.failures else outcome
            line = Text(f"{label.upper()} ", style=style)
            line.append(nodeid)
            if collector.messages.get(nodeid):
                line.append(f" - {collector.messages[nodeid]}", style="dim")
            console.print(line, soft_wrap=True)
    for reason, count in collector.reasons().items():
        console.print(Text(f"{count} test(s) not applicable: {reason}", style="dim"), soft_wrap=True)
