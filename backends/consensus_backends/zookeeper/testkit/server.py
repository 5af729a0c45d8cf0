"""ZooKeeper test server: Debian's ``zookeeper`` jars run as a standalone JVM (the ensemble of
``start_cluster``: ``consensus_backends.zookeeper.testkit.ensemble``).

``tickTime=500`` allows client session timeouts from 1 s to 60 s. Commits
survive a kill -9 (``forceSync=no``: the OS holds the transaction log), not a
machine crash, as on the PostgreSQL and etcd test servers. The secure
variant (``start(secure=True)``) serves clients only on a TLS port (Netty,
client certificates required) with certificates made at start
(``consensus_testkit.certificates``, in ``<dir>/certs``); its URL names
the user ``consensus`` and the chroot ``/consensus``, a znode whose digest ACL
admits only that user (``/elsewhere`` admits only another user). The plain
port stays open for the readiness probe (``srvr``) and the launcher's setup only.
"""

from __future__ import annotations

import secrets
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from kazoo.client import KazooClient
from kazoo.security import make_digest_acl

from consensus_testkit.certificates import write_certificates
from consensus_testkit.cluster import NodeStatus
from consensus_testkit.host import HOST, free_port, java_binary, tcp_request
from consensus_testkit.process import ServerHandle, launch

START_TIMEOUT = 30.0
JAVA_DIR = Path("/usr/share/java")
LOG4J_CONF = Path("/etc/zookeeper/conf/log4j.properties")


def _classpath() -> str:
    """Debian's ZooKeeper jar (its manifest brings the rest) plus a log4j 1.2 binding when present."""
    jar = JAVA_DIR / "zookeeper.jar"
    if not jar.is_file():
        raise RuntimeError(f"{jar} not found: run `consensus servers install zookeeper`")
    extra = [JAVA_DIR / "slf4j-log4j12.jar", JAVA_DIR / "log4j-1.2.jar"]
    parts = [jar, *extra] if all(p.is_file() for p in extra) else [jar]
    return ":".join(str(p) for p in parts)


def probe(port: int) -> bool:
    """``srvr`` answers only once the server serves (``ruok`` answers earlier)."""
    return b"Zookeeper version:" in tcp_request(port, b"srvr")


#: Jars the Netty connection factory needs besides those zookeeper.jar's manifest names.
NETTY_JARS = ("netty-codec", "netty-resolver", "netty-transport-native-unix-common", "netty-handler")

#: The user and chroot of the secure variant's URL.
SECURE_USER = "consensus"
SECURE_CHROOT = "/consensus"


def _tls_config(directory: Path, secure_port: int) -> str:
    certs = write_certificates(directory / "certs")
    return (
        f"secureClientPort={secure_port}\n"
        "serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory\n"
        f"ssl.keyStore.location={certs / 'keystore.pem'}\nssl.keyStore.type=PEM\n"
        f"ssl.trustStore.location={certs / 'ca.pem'}\nssl.trustStore.type=PEM\n"
        "ssl.clientAuth=need\n"
    )


def _protect_chroot(port: int, password: str) -> None:
    """The secure variant's ACLs (set over the plain port): the chroot admits only ``SECURE_USER``,
    ``/elsewhere`` only another user."""
    client = KazooClient(hosts=f"{HOST}:{port}", timeout=10)
    client.start(timeout=10)
    try:
        client.create(SECURE_CHROOT, b"", acl=[make_digest_acl(SECURE_USER, password, all=True)])
        other = make_digest_acl("someone-else", secrets.token_urlsafe(16), all=True)
        client.create("/elsewhere", b"", acl=[other])
    finally:
        client.stop()
        client.close()


STANDALONE_MAIN = "org.apache.zookeeper.server.ZooKeeperServerMain"


def _write_config(directory: Path, port: int, extra: str = "") -> Path:
    """``<directory>/zoo.cfg`` of a server whose clients use ``port``, with ``extra`` lines."""
    config = directory / "zoo.cfg"
    config.write_text(
        extra + "tickTime=500\n"
        f"dataDir={directory / 'data'}\n"
        "forceSync=no\n"
        f"clientPort={port}\n"
        f"clientPortAddress={HOST}\n"
        "maxClientCnxns=0\n"
        "admin.enableServer=false\n"
        "4lw.commands.whitelist=ruok,srvr,stat,mntr,cons,dump\n"
        "minSessionTimeout=1000\n"
        "maxSessionTimeout=60000\n"
    )
    return config


def _command(
    java: str, classpath: str, directory: Path, config: Path, main: str, *, heap: str = "256m"
) -> list[str]:
    """The JVM command line of one server (SerialGC, a ``heap`` limit)."""
    return [
        java,
        f"-Xmx{heap}",
        "-XX:+UseSerialGC",
        "-XX:TieredStopAtLevel=1",
        f"-Dzookeeper.log.dir={directory / 'log'}",
        "-Dzookeeper.root.logger=INFO,CONSOLE",
        f"-Dlog4j.configuration=file:{LOG4J_CONF}",
        "-cp",
        classpath,
        main,
        str(config),
    ]


def start(workdir: Path | None = None, *, secure: bool = False) -> ServerHandle:
    """Start a fresh standalone ZooKeeper on a free loopback port and wait until ``srvr`` answers."""
    java, classpath = java_binary(), _classpath()
    directory = Path(tempfile.mkdtemp(prefix="zookeeper-", dir=workdir))
    port = free_port()
    client_port = free_port() if secure else port
    url = f"zookeeper://{HOST}:{port}"
    tls = ""
    if secure:
        tls = _tls_config(directory, client_port)
        classpath = ":".join([classpath, *(str(JAVA_DIR / f"{jar}.jar") for jar in NETTY_JARS)])
        password = secrets.token_urlsafe(16)
        certs = directory / "certs"
        (directory / "probe-port").write_text(str(port))  # testing.PROBE_PORT_FILE
        query = urlencode(
            {"tls_ca": certs / "ca.pem", "tls_cert": certs / "client.pem", "tls_key": certs / "client.key"}
        )
        url = f"zookeeper://{SECURE_USER}:{password}@{HOST}:{client_port}{SECURE_CHROOT}?{query}"
    config = _write_config(directory, port, tls)
    command = _command(java, classpath, directory, config, STANDALONE_MAIN)
    handle = ServerHandle(
        "zookeeper",
        url,
        client_port,
        directory,
        command=command,
        probe=lambda: probe(port),
    )
    return launch(handle, START_TIMEOUT, then=(lambda: _protect_chroot(port, password)) if secure else None)


def status(port: int) -> NodeStatus | None:
    """The role (``srvr``'s mode: leader, follower, standalone) and epoch (of the last zxid) of the
    server whose clients use ``port``; None when it does not serve."""
    answer = tcp_request(port, b"srvr").decode(errors="replace")
    fields = dict(line.partition(": ")[::2] for line in answer.splitlines() if ": " in line)
    if "Mode" not in fields:
        return None
    try:
        epoch: int | None = int(fields.get("Zxid", ""), 16) >> 32
    except ValueError:
        epoch = None
    return NodeStatus(fields["Mode"].strip(), epoch)


def serves_session(port: int, identity: Mapping[str, Any]) -> bool:
    """Whether the server at ``port`` holds the client connection of the ZooKeeper session
    ``identity`` names (``{"session_id": int, ...}``, the backend's ``fault_identity``): ``cons``."""
    session_id = identity.get("session_id")
    if not isinstance(session_id, int):
        return False
    return f"sid=0x{session_id:x}," in tcp_request(port, b"cons").decode(errors="replace")
