"""The Redis backend's test server, registered as any third-party launcher is: Debian's
``redis-server``."""

from __future__ import annotations

import shutil
from pathlib import Path

from consensus_redis.testkit import server
from consensus_testkit.launchers import Launcher
from consensus_testkit.prerequisites import DebianPackage

REDIS_PACKAGE = DebianPackage(
    what="Redis",
    packages=("redis-server",),
    present=lambda: bool(shutil.which("redis-server")) or Path("/usr/bin/redis-server").is_file(),
)

REDIS = Launcher(name="redis", start=server.start, probe=server.probe, secure=True, needs=(REDIS_PACKAGE,))
