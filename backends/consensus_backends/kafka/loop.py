"""The IO loop the members of one session share, and a member's connections on it.

kafka-python runs every coroutine and connection callback of a client on one
``NetworkSelector`` and its thread; a member per session and group with a
selector of its own would cost a thread each (:mod:`consensus_backends.kafka.member`).
"""

from __future__ import annotations

import heapq
import logging
import selectors
import time
from typing import Any

from kafka.net.manager import KafkaConnectionManager
from kafka.net.selector import NetworkSelector, Task, TaskState

from consensus_backends.kafka.settings import Settings

log = logging.getLogger("consensus_api.kafka")


class Selector(NetworkSelector):  # type: ignore[misc]  # kafka-python is untyped
    """One IO thread (kafka-python's event loop) shared by the members of a session.

    Every coroutine of a member, and every callback of its connection, runs on
    this thread; none of :class:`Member`'s blocks it (a blocking hook belongs on
    a member with a selector of its own, as the Coordinator's does)."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(**settings.client())
        self.start()

    def shut(self, timeout: float) -> None:
        """Stop the IO thread (waiting at most ``timeout`` s) and close the selector; a thread that
        does not stop in time is left to end with the process (a daemon)."""
        thread = self._io_thread
        self.stop(timeout_ms=timeout * 1000)
        if thread is not None and thread.is_alive():
            log.warning("the Kafka members' IO thread did not stop within %.1f s", timeout)
            return
        self.close()

    # Two costs that grow with the members sharing the loop, changed without changing behaviour
    # (kafka-python 3.0's NetworkSelector; pinned below 3.1):

    def _unschedule(self, task: Task) -> None:
        """Cancel a timer lazily: its heap entry stays and ``_schedule_tasks`` skips it, instead of
        kafka-python's ``list.remove`` and ``heapify`` (linear in the timers of every member)
        on every cancelled request or I/O timeout."""
        task.scheduled_at = None
        task.state = TaskState.UNSCHEDULED

    def _schedule_tasks(self) -> None:
        now = time.monotonic()
        while self._scheduled and self._scheduled[0][0] <= now:
            when, task = heapq.heappop(self._scheduled)
            if task.state is TaskState.SCHEDULED and task.scheduled_at == when:  # else cancelled or moved
                task.scheduled_at = None
                self._add_ready_task(task)

    def register_event(self, fileobj: Any, event: int, task: Any) -> None:
        """kafka-python's, without ``get_key``'s ``KeyError`` for an unregistered socket (which
        formats the socket's ``repr``, a system call, on every first wait of a connection)."""
        if not isinstance(task, Task):
            task = Task(task)
        key = self._selector.get_map().get(fileobj)
        if key is None:
            data = (task, None) if event == selectors.EVENT_READ else (None, task)
            self._selector.register(fileobj, event, data)
            return
        reader, writer = key.data
        if (reader if event == selectors.EVENT_READ else writer) is not None:
            raise RuntimeError(f"event {event} already registered for a socket")
        data = (task, writer) if event == selectors.EVENT_READ else (reader, task)
        self._selector.modify(fileobj, key.events | event, data)


class Manager(KafkaConnectionManager):  # type: ignore[misc]  # kafka-python is untyped
    """A member's connections; its idle-connection check stops rescheduling itself once closed
    (on a shared selector it would otherwise outlive the member)."""

    def close_idle_connections(self) -> None:
        if not getattr(self, "closed", False):  # also called before __init__ sets ``closed``
            super().close_idle_connections()
