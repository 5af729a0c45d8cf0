"""``consensus group describe`` on SQLite: the table and the --json document."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

import consensus_api as ca
from consensus_api.cli import cli


class _Quiet:
    def on_assigned(self, resources: frozenset[str]) -> None:
        pass

    def on_revoked(self, resources: frozenset[str]) -> None:
        pass


def test_group_describe_shows_members_and_their_resources(tmp_path: Path) -> None:
    """Two resource members (one static): mode, generation, instance ids, each one's resources."""
    url = f"sqlite:///{tmp_path / 'group.db'}"
    resources = [f"r{index}" for index in range(4)]
    with ca.connect(url, session_timeout=3) as first, ca.connect(url, session_timeout=3) as second:
        for session, instance in ((first, "worker-1"), (second, None)):
            handler = ca.ResourceHandler(resources, _Quiet(), assignors=["range"])
            handler.join(
                session, "jobs", rebalance_timeout=4, group_instance_id=instance
            ).ensure_active_group(20)
        generation = second.describe_group("jobs").generation
        result = CliRunner().invoke(cli, ["group", "describe", "jobs", "--url", url, "--json"])
        table = CliRunner().invoke(cli, ["group", "describe", "jobs", "--url", url])
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    assert (document["mode"], document["state"], document["generation"]) == ("eager", "stable", generation)
    members = document["members"]
    assert sorted(m["instance"] or "" for m in members) == ["", "worker-1"]
    assert sorted(r for m in members for r in m["resources"]) == resources
    assert table.exit_code == 0 and "worker-1" in table.output and "eager" in table.output
