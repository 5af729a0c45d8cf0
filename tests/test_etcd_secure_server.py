"""The secured etcd test server (TLS, client certificates, auth on) survives restarts: its readiness probe
passes with auth on, whichever listener etcd's JSON gateway dials after each start, and the URL's user
reads and writes its prefix again (the fault tests restart it many times in one run)."""

from __future__ import annotations

from pathlib import Path

import consensus_api as ca
from consensus_backends.etcd.testkit.server import probe, start
from consensus_testkit.launchers import PROBE_PORT_FILE

#: etcd picks the gateway's listener at random at each start, the TLS one about one time in five (measured:
#: 8 of 40): 25 restarts miss it with a chance under 0.4 %.
RESTARTS = 25


def test_secured_etcd_is_ready_after_every_restart(tmp_path: Path) -> None:
    server = start(tmp_path, secure=True)
    try:
        plain_port = int((server.directory / PROBE_PORT_FILE).read_text())
        assert probe(plain_port)
        for round_ in range(RESTARTS):
            server.restart(timeout=20)  # waits for the probe: a refused probe is a timeout here
            with ca.connect(server.url) as session:
                session.storage.put(f"restart/{round_}", b"v")
                assert session.storage.fetch(f"restart/{round_}") is not None
    finally:
        server.stop()
