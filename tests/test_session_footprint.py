"""What a session at rest loads (issue 36, docs/performance.md "A session at rest"): a session that
stores, listens, joins a group and stands for election loads neither the coordinator's engine, the
assignors, the bridge, the asyncio face, the migration tools nor the command line; the public names
that live there stay importable from ``consensus_api`` and load on first use."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import consensus_api
import consensus_api.coordinator

#: Modules (and their submodules) an idle session must not load.
NOT_AT_REST = (
    "consensus_api.coordinator.core",
    "consensus_api.coordinator.incremental",
    "consensus_api.coordinator.generic",
    "consensus_api.assignors",
    "consensus_api.bridging",
    "consensus_api.aio",
    "consensus_api.migrate",
    "consensus_api.cli",
    "consensus_api.tooz_driver",
    "consensus_api.children",
    "click",
    "rich",
    "sqlalchemy.dialects.postgresql",
)

IDLE_SESSION = """
import json, sys
import consensus_api
import consensus_api.coordinator
with consensus_api.connect(sys.argv[1]) as session:
    session.storage.put("idle/watched", b"start")
    session.listeners.add_value_listener("idle/watched", lambda event: None)
    session.group("idle").join("member")
    session.election("idle").nominate("member")
    print(json.dumps(sorted(sys.modules)))
"""


def test_an_idle_session_loads_nothing_it_does_not_use(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'idle.db'}"
    proc = subprocess.run(
        [sys.executable, "-c", IDLE_SESSION, url], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    loaded = json.loads(proc.stdout.splitlines()[-1])
    assert [name for name in loaded if name.startswith(NOT_AT_REST)] == []


def test_the_coordinator_names_load_on_first_use() -> None:
    from consensus_api import Assignor, Coordinator, IncrementalCoordinator, ResourceHandler  # noqa: PLC0415
    from consensus_api.coordinator.core import Coordinator as CoreCoordinator  # noqa: PLC0415

    assert Coordinator is CoreCoordinator
    assert {"Assignor", "Coordinator", "IncrementalCoordinator", "ResourceHandler"} <= set(dir(consensus_api))
    assert all(hasattr(consensus_api, name) for name in consensus_api.__all__)
    assert IncrementalCoordinator.__module__ == "consensus_api.coordinator.incremental"
    assert ResourceHandler.__module__ == "consensus_api.coordinator.resources"
    assert Assignor.__module__ == "consensus_api.assignors"


def test_an_unknown_name_is_still_an_attribute_error() -> None:
    assert not hasattr(consensus_api, "NoSuchName")
    assert not hasattr(consensus_api.coordinator, "NoSuchName")
