"""ZooKeeper test server: Debian's ``zookeeper`` jars run as a standalone JVM.

``tickTime=500`` allows client session timeouts from 1 s to 60 s.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from consensus_api.testing._process import HOST, ServerHandle, free_port, java_binary, launch, tcp_request

START_TIMEOUT = 30.0
JAVA_DIR = Path("/usr/share/java")
LOG4J_CONF = Path("/etc/zookeeper/conf/log4j.properties")


def _classpath() -> str:
    """Debian's ZooKeeper jar (its manifest brings the rest) plus a log4j 1.2 binding when present."""
    jar = JAVA_DIR / "zookeeper.jar"
    if not jar.is_file():
        raise RuntimeError(f"{jar} not found: run scripts/install.sh")
    extra = [JAVA_DIR / "slf4j-log4j12.jar", JAVA_DIR / "log4j-1.2.jar"]
    parts = [jar, *extra] if all(p.is_file() for p in extra) else [jar]
    return ":".join(str(p) for p in parts)


def probe(port: int) -> bool:
    """``srvr`` answers only once the server serves (``ruok`` answers earlier)."""
    return b"Zookeeper version:" in tcp_request(port, b"srvr")


def start(workdir: Path | None = None) -> ServerHandle:
    """Start a fresh standalone ZooKeeper on a free loopback port and wait until ``srvr`` answers."""
    java, classpath = java_binary(), _classpath()
    directory = Path(tempfile.mkdtemp(prefix="zookeeper-", dir=workdir))
    port = free_port()
    config = directory / "zoo.cfg"
    config.write_text(
        "tickTime=500\n"
        f"dataDir={directory / 'data'}\n"
        f"clientPort={port}\n"
        f"clientPortAddress={HOST}\n"
        "maxClientCnxns=0\n"
        "admin.enableServer=false\n"
        "4lw.commands.whitelist=ruok,srvr,stat,mntr,cons,dump\n"
        "minSessionTimeout=1000\n"
        "maxSessionTimeout=60000\n"
    )
    command = [
        java,
        "-Xmx256m",
        "-XX:+UseSerialGC",
        "-XX:TieredStopAtLevel=1",
        f"-Dzookeeper.log.dir={directory / 'log'}",
        "-Dzookeeper.root.logger=INFO,CONSOLE",
        f"-Dlog4j.configuration=file:{LOG4J_CONF}",
        "-cp",
        classpath,
        "org.apache.zookeeper.server.ZooKeeperServerMain",
        str(config),
    ]
    handle = ServerHandle(
        "zookeeper",
        f"zookeeper://{HOST}:{port}",
        port,
        directory,
        command=command,
        probe=lambda: probe(port),
    )
    return launch(handle, START_TIMEOUT)
