"""The ``consensus`` command: storage, listeners, membership, elections, locks, ping, migrate, demo; and
the commands other products install (``consensus_api.commands``: conformance, servers, chaos, check, bench).

Exit codes: 0 ok, 1 a contract failure, 2 a usage or configuration error
(see ``consensus_api.cli._common``).
"""

from __future__ import annotations

import click

from consensus_api.cli._common import ConsensusGroup, root_url_option
from consensus_api.cli.demo import demo
from consensus_api.cli.elect import elect
from consensus_api.cli.group import group
from consensus_api.cli.info import leader, members
from consensus_api.cli.kv import kv
from consensus_api.cli.lock import lock
from consensus_api.cli.migrate import migrate
from consensus_api.cli.ping import ping
from consensus_api.cli.watch import watch

__all__ = ["cli", "main"]


@click.group(cls=ConsensusGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="consensus-api", prog_name="consensus")
@root_url_option
def cli() -> None:
    """One API for coordination over ZooKeeper, etcd, Kafka and SQL.

    The commands that take --url take it before or after the command name
    (default: $CONSENSUS_URL, then consensus.toml, then sqlite:///consensus.db).
    Exit status: 0 ok, 1 contract failure, 2 usage or configuration error (lock
    and elect: see their --help).
    """


for _command in (
    kv,
    watch,
    members,
    leader,
    lock,
    elect,
    group,
    ping,
    demo,
    migrate,
):
    cli.add_command(_command)


def main() -> None:
    """Console-script entry point."""
    cli()
