"""ZooKeeper connect against a real server that answers the handshake, then goes silent: every phase
of ``connect`` comes out of ``connect_timeout``, and a failed connect leaves no thread or socket."""

from __future__ import annotations

import threading
import time

import psutil
import pytest

import consensus_api as ca
from consensus_testkit import ServerHandle
from consensus_testkit.proxy import TcpProxy

CONNECT_TIMEOUT = 1.0
ATTEMPTS = 20


def _fail_to_connect(server: ServerHandle, replies: int) -> float:
    """Connect through a proxy that stalls after ``replies`` answers of the server; the seconds
    ``connect`` took to raise ``BackendUnavailableError``."""
    with TcpProxy(server.proxy_target) as proxy:
        proxy.stall_after(replies)
        started = time.monotonic()
        with pytest.raises(ca.BackendUnavailableError, match=r"within connect_timeout|within 1 s"):
            ca.connect(
                proxy.url_for(server.url) + "/silent",
                connect_timeout=CONNECT_TIMEOUT,
                request_timeout=10,  # longer than connect_timeout: open must not use it
            )
        return time.monotonic() - started


@pytest.mark.parametrize("replies", [1, 0], ids=["silent after the handshake", "silent from the start"])
def test_failed_connects_end_within_connect_timeout_and_leave_nothing(
    zk_server: ServerHandle, replies: int
) -> None:
    with ca.connect(zk_server.url + "/silent", connect_timeout=5):
        pass  # the chroot exists: only the server's silence can fail the connects below
    process = psutil.Process()
    threads, descriptors = threading.active_count(), process.num_fds()
    took = [_fail_to_connect(zk_server, replies) for _ in range(ATTEMPTS)]
    assert max(took) < CONNECT_TIMEOUT + 0.5, took
    assert threading.active_count() <= threads, [t.name for t in threading.enumerate()]
    assert process.num_fds() <= descriptors, process.open_files()
