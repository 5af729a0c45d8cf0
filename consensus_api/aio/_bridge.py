"""The two ways between the threaded core and one event loop.

* :class:`Bridge` runs each blocking call of the core on a bounded thread pool
  and awaits it, so the loop never blocks.
* :class:`EventStream` turns callbacks of the session's dispatcher thread into
  an async iterator: the callback stores the event and wakes the loop with
  ``loop.call_soon_threadsafe``; a consumer slower than the events finds them
  coalesced (at most two held, see :class:`EventStream`), never queued without bound.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Callable
from functools import partial
from types import TracebackType
from typing import Generic, Self, TypeVar, cast

from consensus_api.errors import ConfigurationError

log = logging.getLogger("consensus_api.aio")

T = TypeVar("T")
E = TypeVar("E")

Callback = Callable[[E], None]


def check_workers(workers: object) -> int:
    """``workers`` if it is a positive int, else ``ConfigurationError``."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ConfigurationError(f"workers must be a positive int, not {workers!r}")
    return workers


class Bridge:
    """One session's event loop and its pool of ``workers`` threads for blocking calls."""

    def __init__(self, loop: asyncio.AbstractEventLoop, workers: int) -> None:
        check_workers(workers)
        self.loop = loop
        self._pool = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="consensus-aio")

    async def run(self, call: Callable[[], T], *, write: str | None = None) -> T:
        """Await ``call()`` run on the pool.

        Cancelling the awaiting task before the call started means it never runs.
        Once it runs it is not interrupted: it completes or fails by itself
        (within the session's ``request_timeout``), so the core's state is never
        half-updated. A ``write`` (its description) cancelled while running
        raises ``CancelledError`` saying its effect is unknown, like ``OperationTimeoutError``.
        """
        outcome: asyncio.Future[T] = self.loop.create_future()

        def work() -> None:
            try:
                result = call()
            except BaseException as exc:
                self.call_on_loop(partial(_settle, outcome, None, exc))
            else:
                self.call_on_loop(partial(_settle, outcome, result, None))

        job = self._pool.submit(work)
        try:
            return await outcome
        except asyncio.CancelledError as cancelled:
            if job.cancel() or write is None:
                raise
            raise asyncio.CancelledError(
                f"{write} was cancelled while in flight: its effect is unknown "
                "(it completes or fails by itself within request_timeout)"
            ) from cancelled

    def shutdown(self) -> None:
        """Let the running calls finish in the background; start no new ones."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    def call_on_loop(self, callback: Callable[[], object]) -> bool:
        """Schedule ``callback`` on the loop from any thread; False once the loop is closed."""
        try:
            self.loop.call_soon_threadsafe(callback)
        except RuntimeError:
            return False
        return True


def _settle(outcome: asyncio.Future[T], result: T | None, error: BaseException | None) -> None:
    """Complete ``outcome`` on the loop, unless its awaiting task was cancelled meanwhile."""
    if outcome.done():
        ending = "completed" if error is None else f"failed ({type(error).__name__})"
        log.debug("a call whose awaiting task was cancelled has %s", ending)
        return
    if error is not None:
        outcome.set_exception(error)
    else:
        outcome.set_result(cast(T, result))


class EventStream(Generic[E]):
    """The events of one subscription as an async iterator (``async for event in stream``).

    Delivery contract: the first event is the current state, events come in
    order, the last one equals the current state. A consumer slower than the
    events gets them coalesced: only the newest is held, plus, before it, the
    newest *sticky* event (a session loss, a leadership lost) which is never
    coalesced away - so at most two are held. The subscription starts on the
    first ``__anext__`` and ends with ``aclose()`` (or ``async with`` exit) or
    when the session closes; iteration then stops after the held events.
    """

    def __init__(
        self,
        bridge: Bridge,
        subscribe: Callable[[Callback[E]], None],
        unsubscribe: Callable[[Callback[E]], None],
        *,
        sticky: Callable[[E], bool] = lambda _: False,
        current: Callable[[], E] | None = None,
        on_finish: Callable[[EventStream[E]], None] = lambda _: None,
    ) -> None:
        self._bridge = bridge
        self._subscribe = subscribe
        self._unsubscribe = unsubscribe
        self._sticky = sticky
        self._current = current
        self._on_finish = on_finish
        self._lock = threading.Lock()
        self._held: list[E] = []
        self._offered = False
        self._wake_scheduled = False
        self._ready = asyncio.Event()
        self._subscribed = False
        self._finished = False

    def push(self, event: E) -> None:
        """The callback (any thread): hold ``event``, coalescing what the consumer has not taken."""
        with self._lock:
            if self._finished:
                return
            self._offered = True
            keep = [held for held in self._held if self._sticky(held)][-1:]
            self._held = [event] if self._sticky(event) else [*keep, event]
            if self._wake_scheduled:
                return
            self._wake_scheduled = True
        self._bridge.call_on_loop(self._wake)

    def finish(self) -> None:
        """End iteration after the held events (the session closed). Loop thread."""
        with self._lock:
            self._finished = True
        self._ready.set()

    def _wake(self) -> None:
        with self._lock:
            self._wake_scheduled = False
        self._ready.set()

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> E:
        if not self._subscribed and not self._finished:
            self._subscribed = True
            try:
                await self._bridge.run(lambda: self._subscribe(self.push))
            except BaseException:
                self._subscribed = False
                raise
            if self._current is not None:
                first = self._current()
                with self._lock:
                    offer = not self._offered
                if offer:
                    self.push(first)
        while True:
            with self._lock:
                if self._held:
                    return self._held.pop(0)
                if self._finished:
                    raise StopAsyncIteration
                self._ready.clear()
            await self._ready.wait()

    async def aclose(self) -> None:
        """Unsubscribe and stop iterating. Idempotent."""
        with self._lock:
            was_finished, self._finished = self._finished, True
            self._held.clear()
        self._ready.set()
        self._on_finish(self)
        if self._subscribed and not was_finished:
            await self._bridge.run(lambda: self._unsubscribe(self.push))

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
