"""The suite's child processes (workers, coordinator members) on the runtime's child harness.

A child is ``python -m MODULE ARGS [--opt NAME=VALUE ...] --lifetime S`` with
``$CONSENSUS_URL`` set (:class:`consensus_api.children.Child`). The parent keeps
every report line in an ``EventLog`` as well, for the tests to wait on; ``expect``
fails the test (``AssertionError``, with the child's stderr) when the line does
not come in time or the child exits first. The child's side: ``child_options``,
``child_parser`` and ``child_start`` (the harness's :class:`~consensus_api.children.Parent`:
commands, and a watchdog that ends the child once its lifetime is over).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import Any

from consensus_api.children import Child, Parent
from consensus_testkit.conformance.helpers import EVENT_TIMEOUT, EventLog


def child_options(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """``parser`` with the options of every child: ``--opt NAME=VALUE``... (session options) and
    ``--lifetime S``."""
    parser.add_argument("--opt", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--lifetime", type=float, default=120.0)
    return parser


def child_parser(module: str) -> tuple[argparse.ArgumentParser, argparse.ArgumentParser, Any]:
    """The command line of a worker child: ``URL`` (``-``: ``$CONSENSUS_URL``), then a command.
    Returns the parser, the options every command takes (``child_options``; pass it as ``parents``)
    and the commands (``add_parser``)."""
    common = child_options(argparse.ArgumentParser(add_help=False))
    parser = argparse.ArgumentParser(prog=f"python -m {module}")
    parser.add_argument("url")
    commands = parser.add_subparsers(dest="command", required=True)
    return parser, common, commands


def child_start(args: argparse.Namespace, grace: float = 0.0) -> tuple[Parent, dict[str, str]]:
    """The link to the parent, its watchdog armed (the process exits ``grace`` seconds after its
    ``--lifetime``, or after stdin closed, whatever happens), and the session options of ``--opt``."""
    parent = Parent(args.lifetime, grace=grace)
    return parent, dict(item.partition("=")[::2] for item in args.opt)


class ChildProcess(Child):
    """A child Python process of the suite: its report lines (``lines``), commands, signals and
    teardown."""

    def __init__(
        self,
        module: str,
        args: Sequence[str],
        url: str,
        options: Mapping[str, object],
        lifetime: float = 120.0,
        *,
        name: str,
        launcher: Sequence[str] = (),
    ) -> None:
        """Start the child; ``launcher`` prefixes its command line (e.g. ``NetworkNamespace.prefix``)."""
        self.lines: EventLog[str] = EventLog(name)
        opts = [part for option, value in options.items() for part in ("--opt", f"{option}={value}")]
        super().__init__(module, [*args, *opts], lifetime=lifetime, url=url, name=name, launcher=launcher,
                         on_line=self.lines)  # fmt: skip

    def expect(self, prefix: str, timeout: float = EVENT_TIMEOUT, *, since: int = 0) -> tuple[int, str]:
        """The index and text of the first line at ``since`` or later that starts with ``prefix``."""
        found = self.wait_line(lambda line: line.startswith(prefix), timeout, since=since)
        if found is not None:
            return found
        if self.ended:
            self.process.wait(5)
            raise AssertionError(
                f"{self.name} exited ({self.process.returncode}) before printing {prefix!r}; "
                f"lines: {self.lines.events}\nchild stderr:\n{self.stderr_tail()}"
            )
        raise AssertionError(
            f"{self.name}: timed out after {timeout:.1f}s waiting for a line starting with {prefix!r}; "
            f"lines: {self.lines.events[since:]}\nchild stderr:\n{self.stderr_tail()}"
        )
