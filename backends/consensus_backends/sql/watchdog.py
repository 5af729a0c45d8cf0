"""The ``Watchdog``: it cuts the socket of a call that outlives its deadline.

A paused server or a network that stopped delivering answers nothing while TCP
keeps the connection up, so neither the server's ``statement_timeout`` nor TCP
ends the driver's wait; shutting the socket down does, at once, with a
disconnect error (``client``'s module docstring has the other bounds).
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import os
import socket
import threading
import time
from typing import Any

#: Disarmed deadlines the watchdog's queue may hold beyond twice the armed ones before it is compacted.
STALE_ENTRIES = 64


class Watchdog:
    """Cuts the connection of a call that outlives its deadline (one thread for every call).

    ``arm(dbapi_connection, deadline)`` returns a token; ``disarm(token)`` returns
    True if the watchdog cut the connection meanwhile. A cut shuts the socket
    down (on a duplicate of its descriptor), so the driver's wait ends with a
    disconnect error and SQLAlchemy discards the connection.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._armed: dict[int, Any] = {}
        self._queue: list[tuple[float, int]] = []
        self._fired: set[int] = set()
        self._tokens = itertools.count()
        self._thread: threading.Thread | None = None

    def arm(self, dbapi_connection: Any, deadline: float) -> int:
        """Watch ``dbapi_connection`` until ``deadline``; the thread wakes only for an earlier deadline."""
        token = next(self._tokens)
        with self._cond:
            self._armed[token] = dbapi_connection
            if len(self._queue) > 2 * len(self._armed) + STALE_ENTRIES:
                self._queue = [entry for entry in self._queue if entry[1] in self._armed]
                heapq.heapify(self._queue)
            heapq.heappush(self._queue, (deadline, token))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="consensus-sql-watchdog", daemon=True)
                self._thread.start()
            elif self._queue[0][1] == token:
                self._cond.notify()
        return token

    def disarm(self, token: int) -> bool:
        with self._cond:
            self._armed.pop(token, None)
            if token in self._fired:
                self._fired.discard(token)
                return True
            return False

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._queue and self._queue[0][1] not in self._armed:
                    heapq.heappop(self._queue)
                wait = self._queue[0][0] - time.monotonic() if self._queue else None
                if wait is None or wait > 0:
                    self._cond.wait(wait)
                    continue
                _, token = heapq.heappop(self._queue)
                connection = self._armed.pop(token)
                self._fired.add(token)
            cut(connection)


def cut(dbapi_connection: Any) -> None:
    """Shut the socket of a psycopg or PyMySQL connection down; the connection itself stays the driver's."""
    try:
        pgconn = getattr(dbapi_connection, "pgconn", None)
        descriptor = pgconn.socket if pgconn is not None else dbapi_connection._sock.fileno()
        duplicate = socket.socket(fileno=os.dup(descriptor))
    except Exception:  # closed meanwhile: nothing to cut
        return
    with contextlib.suppress(OSError):
        duplicate.shutdown(socket.SHUT_RDWR)
    duplicate.close()
