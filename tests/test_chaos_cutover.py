"""``consensus chaos --workload cutover`` end to end on SQLite -> SQLite: clients on bridged sessions
under client kills and pauses, the cut-over half-way; the history spans both stores and ``consensus
check`` passes. With the seal planted out (``FloorBackend.seal`` a no-op in this process, where the
runner cuts over) the check fails.

Both runs take a slow cut-over: ``SLOW_STEP`` seconds pass after the catch-up (``_catch_up`` wrapped in
this process). With the seal that changes nothing (the old store is frozen, writes wait for authority
to move); without it every write the old store accepts meanwhile is lost, so the defect shows every
time, not only when a write happens to fall into the moments between the last copy and the clients
moving."""

from __future__ import annotations

import importlib
import json
import os
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from consensus_api.floor import FloorBackend
from consensus_chaos.check import check_history
from consensus_chaos.record.runner import ChaosOptions, run_chaos

#: What the seal protects: each of these fails when it is missing.
SEAL_CHECKS = {"cutover", "cutover-writes", "cutover-fencing"}


#: Seconds the cut-over waits after its catch-up (less than the request timeout writes wait for).
SLOW_STEP = 2.0


@pytest.fixture
def slow_cutover(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cut-over this process runs pauses ``SLOW_STEP`` after it caught up with the old store."""
    cutover = importlib.import_module("consensus_api.migrate.cutover")  # the package names the function so
    catch_up = cutover._catch_up

    def slowly(*args: Any) -> None:
        catch_up(*args)
        time.sleep(SLOW_STEP)

    monkeypatch.setattr(cutover, "_catch_up", slowly)


def _run(out: Path) -> Path:
    options = ChaosOptions(
        url=None,
        server="sqlite",
        migrate_server="sqlite",
        workload="cutover",
        duration=12,
        clients=6,
        keys=1,
        faults=frozenset({"kill", "pause"}),
        fault_interval=2.0,
        out=out,
        seed=11,
    )
    return run_chaos(options).path


@pytest.mark.timeout(300)
@pytest.mark.usefixtures("slow_cutover")
def test_a_cutover_under_faults_spans_both_stores_and_passes(tmp_path: Path) -> None:
    history = _run(tmp_path / "runs")
    rows = pq.read_table(history).to_pylist()
    assert {row["backend"] for row in rows} == {"sqlite->sqlite"}
    cutovers = [row for row in rows if row["kind"] == "migration" and row["f"] == "cutover"]
    assert [row["type"] for row in cutovers][-1] == "ok"
    served = {row["store"] for row in rows if row["kind"] == "cutover" and row["type"] == "ok"}
    assert {"old", "new"} <= served
    finals = [row for row in rows if row["kind"] == "migration" and row["f"] == "final"]
    assert len(finals) == 2 and all(int(row["value"]) > 0 for row in finals)
    outcome = check_history(tmp_path / "runs", "local")
    assert outcome.exit_code == 0, json.dumps(outcome.to_json()["findings"], indent=1)
    assert all(outcome.checks[name].objects > 0 for name in SEAL_CHECKS)


#: A ``sitecustomize`` for the client processes (they inherit ``PYTHONPATH``): their bridged
#: sessions never park, so they go on writing to the old store while the cut-over catches up.
NO_PARKING = """from consensus_api.bridging import BridgeBackend
BridgeBackend._park = lambda self: None
"""


@pytest.mark.timeout(300)
@pytest.mark.usefixtures("slow_cutover")
@pytest.mark.parametrize("sealed", [True, False], ids=["sealed", "seal-planted-out"])
def test_without_the_seal_the_check_fails(
    sealed: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Bridged sessions park before the cut-over seals the old store; the seal guards what parking
    # cannot (a write under way, a client the cut-over could not wait for). Here parking is planted
    # out of the clients (and the cut-over's wait for it out of this process): with the seal, every
    # write they send the old store after it is refused and lands on the new store, and the check
    # passes (the positive control); without it, the writes of the slow cut-over's last seconds
    # stay on the old store, and the check fails.
    plant = tmp_path / "plant"
    plant.mkdir()
    (plant / "sitecustomize.py").write_text(NO_PARKING)
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(plant), os.environ.get("PYTHONPATH")]))
    )
    monkeypatch.setattr(importlib.import_module("consensus_api.migrate.cutover"), "_await_parked", _no_wait)
    if not sealed:
        monkeypatch.setattr(FloorBackend, "seal", lambda self: None)
    _run(tmp_path / "runs")
    outcome = check_history(tmp_path / "runs", "local")
    findings = json.dumps(outcome.to_json()["findings"], indent=1)
    if sealed:
        assert outcome.exit_code == 0, findings
    else:
        assert outcome.exit_code == 1
        assert {finding["check"] for finding in outcome.findings} & SEAL_CHECKS, findings


def _no_wait(*args: object) -> None:
    """The cut-over's wait for the bridged sessions to park, planted out."""
