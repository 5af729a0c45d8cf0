"""A short chaos run on SQLite with client-process faults, checked by the local engine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from consensus_api.cli import cli

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


@pytest.mark.timeout(180)
def test_chaos_run_on_sqlite_with_client_faults_is_correct(tmp_path: Path) -> None:
    out = tmp_path / "history"
    args = ["chaos", "--server", "sqlite", "--duration", "10", "--clients", "3", "--keys", "1"]
    args += ["--faults", "kill,pause", "--fault-interval", "1", "--key-period", "3", "--out", str(out)]
    run = CliRunner().invoke(cli, [*args, "--seed", "7"], catch_exceptions=False)
    assert run.exit_code == 0, run.output
    [history] = out.glob("*.parquet")
    table = pq.read_table(history)
    faults = [row["f"] for row in table.filter(pa.compute.equal(table["type"], "invoke")).to_pylist()
              if row["kind"] == "nemesis"]  # fmt: skip
    assert len(faults) >= 3 and set(faults) <= {"kill-client", "pause-client"}
    assert "kill-client" in faults
    kinds = set(table.column("kind").to_pylist())
    assert {"kv", "election", "group"} <= kinds
    assert table.num_rows > 300
    finals = [row for row in table.to_pylist() if row["f"] == "final"]
    assert finals, "live clients record their final reads"

    checked = CliRunner().invoke(
        cli, ["check", str(out), "--engine", "local", "--json"], catch_exceptions=False
    )
    outcome = json.loads(checked.output)
    assert checked.exit_code == 0, json.dumps(outcome["findings"], indent=1)[:4000]
    assert {name: c["verdict"] for name, c in outcome["checks"].items()} == dict.fromkeys(
        ("linearizability", "listeners", "election", "membership"), "ok"
    )
    assert outcome["faults"].get("kill-client", 0) >= 1
