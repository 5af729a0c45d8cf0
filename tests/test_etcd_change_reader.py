"""etcd: a value's re-read after a watch event is the event itself where it is provably current."""

from __future__ import annotations

import threading
import time
from typing import Any

import consensus_api as ca

TIMEOUT = 10.0


class RangeCount:
    """Counts the session's range requests (each still goes to etcd)."""

    def __init__(self, client: Any) -> None:
        self.calls = 0
        self._range = client.range
        client.range = self

    def __call__(self, request: Any, deadline: float) -> Any:
        self.calls += 1
        return self._range(request, deadline)


def test_value_rereads_come_from_events_and_never_go_behind_a_read(etcd_target: str) -> None:
    with ca.connect(etcd_target) as watcher, ca.connect(etcd_target) as writer:
        backend: Any = watcher._backend
        seen: list[ca.ValueChanged] = []
        arrived = threading.Condition()

        def on(event: ca.ValueChanged) -> None:
            with arrived:
                seen.append(event)
                arrived.notify_all()

        version = writer.storage.put("app/k", b"0")
        watcher.listeners.add_value_listener("app/k", on)
        with arrived:
            assert arrived.wait_for(lambda: bool(seen), TIMEOUT)  # the first event: a linearizable read
        ranges = RangeCount(backend._client)
        for number in range(1, 11):
            version = writer.storage.update("app/k", str(number).encode())
        with arrived:
            assert arrived.wait_for(lambda: seen and seen[-1].version == version, TIMEOUT), seen
        assert seen[-1] == ca.ValueChanged("app/k", b"10", version)
        assert ranges.calls == 0  # every re-read was answered by its event
        reader = backend.change_reader()
        assert reader.fetch("app/k") == ca.Versioned(b"10", version)
        assert ranges.calls == 0

        writer.storage.put("app/other", b"x")  # a later revision, then read by this session
        watcher.storage.fetch("app/other")
        assert ranges.calls == 1
        assert reader.fetch("app/k") == ca.Versioned(b"10", version)  # older than that read: read again
        assert ranges.calls == 2

        writer.storage.delete("app/k")
        deadline = time.monotonic() + TIMEOUT
        while reader.fetch("app/k") is not None:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        with arrived:
            assert arrived.wait_for(lambda: seen[-1].value is None, TIMEOUT), seen
        watcher.listeners.remove_value_listener("app/k", on)
        assert backend._watch.value("app/k") is None  # forgotten with the listener
