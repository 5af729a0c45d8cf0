"""Helpers of the cluster launchers' tests: a check script run under ``consensus servers run NAME
--nodes 3``, attached to the cluster through its control file, and the proof that nothing of the
cluster is left running once the command returned."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil

#: The start of every check script: ``cluster`` attached to the control file; the URL names 3 nodes.
PROLOGUE = """\
import json, os
from pathlib import Path
from consensus_testkit.control import attach_cluster
cluster = attach_cluster(Path(os.environ['CONSENSUS_CONTROL']))
assert os.environ['CONSENSUS_URL'] == cluster.url and cluster.url.count(',') == 2, cluster.url
"""

#: The controller (or ZooKeeper, etcd) leader is killed; another leads in a higher term; it rejoins.
FAILOVER = """\
leader = cluster.wait_leader(30)
term = cluster.status(leader).term
cluster.kill(leader)
new = cluster.wait_leader(30, among=[n for n in cluster.ids if n != leader])
cluster.restart(60, node=leader)
assert cluster.status(new).term > term, (cluster.status(new), term)
"""

#: The end of every check script: the cluster's processes and directory, as its last line.
EPILOGUE = """\
pids = [h.pid for h in cluster.nodes] + [cluster.links.pid]
print(json.dumps({'pids': pids, 'dir': str(cluster.directory)}))
"""


def run_under_servers(tmp_path: Path, backend: str, check: str, timeout: float) -> None:
    """Run ``check`` (after ``PROLOGUE``) under ``consensus servers run BACKEND --nodes 3``: it
    must succeed within ``timeout`` seconds, and no process or file of the cluster is left after."""
    script = tmp_path / "check.py"
    script.write_text(PROLOGUE + check + EPILOGUE)
    result = subprocess.run(
        [sys.executable, "-m", "consensus_api.cli", "servers", "run", backend, "--nodes", "3", "--",
         sys.executable, str(script)],
        capture_output=True, text=True, timeout=timeout, env={**os.environ}, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    left = json.loads(result.stdout.strip().splitlines()[-1])
    assert not [pid for pid in left["pids"] if psutil.pid_exists(pid) and not is_zombie(pid)]
    assert not Path(left["dir"]).exists()


def is_zombie(pid: int | None) -> bool:
    """Whether ``pid`` has ended (a zombie, or gone already)."""
    try:
        return pid is not None and psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
