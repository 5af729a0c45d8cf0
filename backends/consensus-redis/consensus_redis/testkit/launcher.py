"""The Redis backend's test server, registered as any third-party launcher is."""

from __future__ import annotations

from consensus_redis.testkit import server
from consensus_testkit.launchers import Launcher

REDIS = Launcher(name="redis", start=server.start, probe=server.probe, secure=True)
