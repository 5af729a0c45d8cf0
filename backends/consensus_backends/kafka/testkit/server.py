"""Kafka test server: one KRaft node (broker + controller) from Maven Central jars.

The jars come from ``kafka-pom.xml`` via ``consensus servers install kafka`` into
``<cache>/kafka-<version>/libs``. Settings favour tests: no topic
auto-creation, no initial rebalance delay, 1 s minimum group session,
replication factor 1 and one partition for internal topics, and a 3 s broker
session so a restart after kill -9 re-registers within seconds.

Besides its ``PLAINTEXT`` listener the broker has a ``PROXIED`` listener that
advertises another loopback port (``ServerHandle.proxy_port``) where nothing
listens until a test starts a TCP proxy there
(``consensus_testkit.proxy``) forwarding to it: a client that bootstraps
through the proxy learns the proxy's address from the metadata, so every one
of its connections (bootstrap, partition leader, group coordinator) runs
through the proxy.

The secure variant (``start(secure=True)``) serves clients on ``SASL_SSL``
listeners (the client port and ``PROXIED``) with ``SCRAM-SHA-512`` users and
the ``StandardAuthorizer``: its URL names the user ``consensus``, whose ACLs
cover only topics, groups and transactional ids prefixed ``consensus``.
Certificates are made at start, in ``<dir>/certs``. A plaintext listener on
another port (superuser ``ANONYMOUS``, as the controller's) serves the
readiness probe and the launcher's setup (users and ACLs through the admin API,
so no password is on a command line) only.
"""

from __future__ import annotations

import base64
import re
import secrets
import socket
import tempfile
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote

from kafka.admin import (
    ACL,
    ACLOperation,
    ACLPermissionType,
    ACLResourcePatternType,
    KafkaAdminClient,
    ResourcePattern,
    ResourceType,
    ScramMechanism,
    UserScramCredentialUpsertion,
)
from kafka.errors import KafkaError

from consensus_testkit.certificates import write_certificates
from consensus_testkit.host import HOST, cache_dir, free_port, java_binary, run_checked
from consensus_testkit.process import ServerHandle, launch

START_TIMEOUT = 90.0
POM = Path(__file__).with_name("kafka-pom.xml")
# C1 only (TieredStopAtLevel=1) starts the broker ~1 s faster on 2 cores; tests do not need C2's peak speed.
BROKER_JVM = (
    "-Xms512m",
    "-Xmx512m",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:TieredStopAtLevel=1",
    "-Djava.awt.headless=true",
)
TOOL_JVM = ("-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1")
LOG4J2 = """\
status = warn
appender.console.type = Console
appender.console.name = STDOUT
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.stdout.ref = STDOUT
"""


def kafka_version() -> str:
    """The Kafka version pinned in ``kafka-pom.xml``."""
    match = re.search(r"<kafka\.version>([^<]+)</kafka\.version>", POM.read_text())
    if match is None:
        raise RuntimeError(f"no <kafka.version> in {POM}")
    return match.group(1)


def libs_dir() -> Path:
    """The dir holding the broker jars; RuntimeError naming what fetches them when it is not complete."""
    libs = cache_dir() / f"kafka-{kafka_version()}" / "libs"
    if not (libs / ".complete").is_file():
        raise RuntimeError(f"Kafka jars not found in {libs}: run `consensus servers install kafka`")
    return libs


def _server_properties(directory: Path, broker: int, controller: int, proxied: int, proxy: int) -> str:
    settings = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.bootstrap.servers": f"{HOST}:{controller}",
        "listeners": (
            f"PLAINTEXT://{HOST}:{broker},CONTROLLER://{HOST}:{controller},PROXIED://{HOST}:{proxied}"
        ),
        "advertised.listeners": (
            f"PLAINTEXT://{HOST}:{broker},CONTROLLER://{HOST}:{controller},PROXIED://{HOST}:{proxy}"
        ),
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,PROXIED:PLAINTEXT",
        "log.dirs": str(directory / "data"),
        "num.partitions": "1",
        "default.replication.factor": "1",
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        # After a kill -9 the old registration blocks re-registration until its session expires.
        "broker.session.timeout.ms": "3000",
        "broker.heartbeat.interval.ms": "500",
        "group.initial.rebalance.delay.ms": "0",
        "group.min.session.timeout.ms": "1000",
        "num.network.threads": "2",
        "num.io.threads": "2",
        "num.recovery.threads.per.data.dir": "1",
        "log.cleaner.dedupe.buffer.size": "2097152",
        "auto.create.topics.enable": "false",
    }
    return "".join(f"{key}={value}\n" for key, value in settings.items())


#: The secure variant's user; its ACLs cover names with this prefix (the URL path).
SECURE_USER = "consensus"


def _secure_properties(certs: Path, listeners: dict[str, int], proxy: int) -> str:
    """The secure variant's listener, TLS, SASL and authorizer settings (they override the plain ones).

    ``listeners``: port by listener name; PROXIED advertises ``proxy`` instead.
    """
    jaas = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
    settings = {
        "listeners": ",".join(f"{name}://{HOST}:{port}" for name, port in listeners.items()),
        "advertised.listeners": ",".join(
            f"{name}://{HOST}:{proxy if name == 'PROXIED' else port}" for name, port in listeners.items()
        ),
        "listener.security.protocol.map": (
            "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SECURE:SASL_SSL,PROXIED:SASL_SSL"
        ),
        "sasl.enabled.mechanisms": "SCRAM-SHA-512",
        "listener.name.secure.scram-sha-512.sasl.jaas.config": jaas,
        "listener.name.proxied.scram-sha-512.sasl.jaas.config": jaas,
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(certs / "keystore.pem"),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(certs / "ca.pem"),
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": "User:ANONYMOUS",
        "allow.everyone.if.no.acl.found": "false",
    }
    return "".join(f"{key}={value}\n" for key, value in settings.items())


def _add_user_and_acls(plain: int, password: str) -> None:
    """``SECURE_USER`` with ``password`` (SCRAM-SHA-512) and its prefixed ACLs, over the plain listener."""
    admin = KafkaAdminClient(bootstrap_servers=f"{HOST}:{plain}", request_timeout_ms=10_000)
    try:
        admin.alter_user_scram_credentials(
            [UserScramCredentialUpsertion(SECURE_USER, ScramMechanism.SCRAM_SHA_512, password)]
        )
        principal = f"User:{SECURE_USER}"
        prefixed = ACLResourcePatternType.PREFIXED
        patterns = [
            ResourcePattern(kind, SECURE_USER, prefixed)
            for kind in (ResourceType.TOPIC, ResourceType.GROUP, ResourceType.TRANSACTIONAL_ID)
        ]
        acls = [
            ACL(principal, "*", ACLOperation.ALL, ACLPermissionType.ALLOW, pattern) for pattern in patterns
        ]
        cluster = ResourcePattern(ResourceType.CLUSTER, "kafka-cluster", ACLResourcePatternType.LITERAL)
        acls += [
            ACL(principal, "*", operation, ACLPermissionType.ALLOW, cluster)
            for operation in (ACLOperation.DESCRIBE, ACLOperation.IDEMPOTENT_WRITE)
        ]
        result = admin.create_acls(acls)
        if result.get("failed"):
            raise RuntimeError(f"creating Kafka ACLs failed: {result['failed']}")
    finally:
        admin.close()


def _cluster_id() -> str:
    """A random Kafka cluster id; like Kafka's own, never starting with '-' (the CLI would read an option)."""
    while (cid := base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")).startswith("-"):
        pass
    return cid


def probe(port: int) -> bool:
    """Ready when a client can bootstrap and the broker lists itself."""
    try:
        socket.create_connection((HOST, port), timeout=1).close()
    except OSError:
        return False  # not listening yet: skip the costlier client bootstrap
    admin = admin_client(port)
    if admin is None:
        return False
    try:
        return bool(admin.describe_cluster().get("brokers"))
    except KafkaError:
        return False
    finally:
        admin.close()


def admin_client(port: int) -> Any:
    """A ``KafkaAdminClient`` of the broker at ``port`` (2 s to bootstrap, 2 s per request), or None
    if it cannot bootstrap. The caller closes it."""
    try:
        return KafkaAdminClient(
            bootstrap_servers=f"{HOST}:{port}", bootstrap_timeout_ms=2000, request_timeout_ms=2000
        )
    except KafkaError:
        return None


def start(workdir: Path | None = None, *, secure: bool = False) -> ServerHandle:
    """Format and start a fresh single-node KRaft Kafka on free loopback ports.

    Returns once a client can bootstrap; RuntimeError naming what fetches the jars when they are missing.
    """
    java = java_binary()
    classpath = str(libs_dir() / "*")
    directory = Path(tempfile.mkdtemp(prefix="kafka-", dir=workdir))
    broker, controller, proxied, proxy = free_port(), free_port(), free_port(), free_port()
    config, log4j = directory / "server.properties", directory / "log4j2.properties"
    properties = _server_properties(directory, broker, controller, proxied, proxy)
    url, probe_port, password = f"kafka://{HOST}:{broker}", broker, ""
    if secure:
        certs = write_certificates(directory / "certs")
        probe_port = free_port()
        (directory / "probe-port").write_text(str(probe_port))  # testing.PROBE_PORT_FILE
        listeners = {"SECURE": broker, "PLAINTEXT": probe_port, "CONTROLLER": controller, "PROXIED": proxied}
        properties += _secure_properties(certs, listeners, proxy)
        password = secrets.token_urlsafe(16)
        query = f"tls_ca={quote(str(certs / 'ca.pem'))}"
        url = f"kafka://{SECURE_USER}:{password}@{HOST}:{broker}/{SECURE_USER}?{query}"
    config.write_text(properties)
    log4j.write_text(LOG4J2)
    common = [f"-Dlog4j2.configurationFile={log4j}", "-cp", classpath]
    handle = ServerHandle(
        "kafka",
        url,
        broker,
        directory,
        command=[java, *BROKER_JVM, *common, "kafka.Kafka", str(config)],
        probe=lambda: probe(probe_port),
        proxy_port=proxy,
        proxy_target=proxied,
    )
    cluster_id = _cluster_id()
    try:
        format_command = [
            java,
            *TOOL_JVM,
            *common,
            "kafka.tools.StorageTool",
            "format",
            "--standalone",
            "-t",
            cluster_id,
            "-c",
            str(config),
        ]
        run_checked(format_command, handle.log_path, "formatting Kafka storage", timeout=60)
    except BaseException:
        handle.stop()
        raise
    return launch(
        handle, START_TIMEOUT, then=(lambda: _add_user_and_acls(probe_port, password)) if secure else None
    )
