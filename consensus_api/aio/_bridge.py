"""The two ways between the threaded core and one event loop.

* :class:`Bridge` runs each blocking call of the core on one of the session's
  worker threads and awaits it, so the loop never blocks; a read the backend
  answers without waiting (``Backend.nowait_reader``) runs on the loop itself.
* :class:`EventStream` turns callbacks of the session's dispatcher thread into
  an async iterator: the callback stores the event and wakes the loop with
  ``loop.call_soon_threadsafe``; a consumer slower than the events finds them
  coalesced (at most two held, see :class:`EventStream`), never queued without bound.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable
from functools import partial
from types import TracebackType
from typing import Any, Generic, Self, TypeVar, cast

from consensus_api.backend import WouldBlock
from consensus_api.errors import ConfigurationError, SessionLostError

log = logging.getLogger("consensus_api.aio")

T = TypeVar("T")
E = TypeVar("E")

Callback = Callable[[E], None]
#: Gives back what a call whose awaiting task was cancelled returned (``Bridge.run``'s ``undo``).
Undo = Callable[[Any], object]

#: The context the loop runs a finished call's completion in: it only settles a future (the
#: awaiting task resumes in its own context), so no context is copied per call.
_SETTLE_CONTEXT = contextvars.Context()

#: Inline calls (``Bridge.run_nowait``) hold the loop at most this long (plus one call) before
#: handing it back for one turn, however many a task makes without awaiting anything else.
INLINE_HOLD = 0.005


def check_workers(workers: object) -> int:
    """``workers`` if it is a positive int, else ``ConfigurationError``."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ConfigurationError(f"workers must be a positive int, not {workers!r}")
    return workers


class Bridge:
    """One session's event loop and up to ``workers`` threads for its blocking calls.

    A call is one ticket on a ``queue.SimpleQueue``; the first free worker claims
    it (an atomic ``dict.pop``, which a cancellation races for) and sends the
    outcome back with one ``loop.call_soon_threadsafe``. Threads start when a call
    finds every thread busy, up to ``workers``, and live until ``shutdown``; they
    are daemon threads, so a call still running when the interpreter exits is
    abandoned (its effect unknown, like any call cut short).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, workers: int) -> None:
        self.loop = loop
        self._workers = check_workers(workers)
        self._tickets: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        self._unclaimed: dict[int, tuple[Callable[[], Any], asyncio.Future[Any], Undo | None]] = {}
        self._numbers = itertools.count()
        self._threads = 0
        self._in_flight = 0  # calls queued or running: read and written on the loop thread only
        self._closed = False
        self._held_since: float | None = None  # the first inline call since the loop last turned

    async def run_nowait(
        self, nowait: Callable[[], T], call: Callable[[], T], *, write: str | None = None
    ) -> T:
        """``nowait()`` right here on the loop thread; where it raises ``WouldBlock`` (it did
        nothing): ``await run(call, write=write)``.

        ``nowait`` must never wait (``Backend.nowait_reader``): it costs the loop
        one local read. Inline calls made since the loop last ran anything else
        hold it at most ``INLINE_HOLD`` plus one call: then the caller yields one
        turn (``asyncio.sleep(0)``) first. Nothing runs after ``shutdown``.
        """
        while (since := self._held_since) is not None and time.monotonic() - since > INLINE_HOLD:
            await asyncio.sleep(0)
        if self._closed:
            raise SessionLostError("the session is closed; open a new one with consensus_api.aio.connect()")
        if since is None:
            self._held_since = time.monotonic()
            self.loop.call_soon(self._turned, context=_SETTLE_CONTEXT)
        try:
            return nowait()
        except WouldBlock:
            pass
        return await self.run(call, write=write)

    def _turned(self) -> None:
        """The loop ran a callback: whatever held it has let go."""
        self._held_since = None

    async def run(
        self, call: Callable[[], T], *, write: str | None = None, undo: Callable[[T], object] | None = None
    ) -> T:
        """Await ``call()`` run on a worker thread.

        Cancelling the awaiting task before the call started means it never runs.
        Once it runs it is not interrupted: it completes or fails by itself
        (within the session's ``request_timeout``), so the core's state is never
        half-updated. A ``write`` (its description) cancelled while running
        raises ``CancelledError`` saying its effect is unknown, like ``OperationTimeoutError``.
        ``undo``: what a call cancelled while running returns (nobody receives it) is handed to
        ``undo`` on a worker (a lock's lease is released), unless the session closed meanwhile.
        After ``shutdown``: ``SessionLostError`` (the session is closed).
        """
        if self._closed:
            raise SessionLostError("the session is closed; open a new one with consensus_api.aio.connect()")
        outcome: asyncio.Future[T] = self.loop.create_future()
        ticket = self._submit(call, outcome, undo)
        try:
            return await outcome
        except asyncio.CancelledError as cancelled:
            if self._unclaimed.pop(ticket, None) is not None:  # not started: no worker will run it
                self._in_flight -= 1
                raise
            if (
                undo is not None
                and outcome.done()
                and not outcome.cancelled()
                and outcome.exception() is None
            ):
                self._give_back(undo, outcome.result())  # it returned, but the task was cancelled first
            if write is None:
                raise
            raise cancelled_in_flight(write) from cancelled

    def _submit(self, call: Callable[[], T], outcome: asyncio.Future[T], undo: Undo | None) -> int:
        """Queue ``call`` for the first free worker (starting one if all are busy); its ticket."""
        ticket = next(self._numbers)
        self._unclaimed[ticket] = (call, outcome, undo)
        if self._in_flight >= self._threads < self._workers:
            self._threads += 1
            threading.Thread(target=self._serve, name=f"consensus-aio-{self._threads}", daemon=True).start()
        self._in_flight += 1
        self._tickets.put(ticket)
        return ticket

    def _give_back(self, undo: Undo, result: object) -> None:
        """Run ``undo(result)`` on a worker, awaited by nobody (a failure is logged). Loop thread."""
        if self._closed:
            return  # the closed session released everything
        outcome: asyncio.Future[object] = self.loop.create_future()
        outcome.add_done_callback(_log_give_back)
        self._submit(partial(undo, result), outcome, None)

    def shutdown(self) -> None:
        """Let the running calls finish in the background; start no new ones (queued ones fail
        with ``SessionLostError``). Loop thread."""
        self._closed = True
        for ticket in list(self._unclaimed):
            claimed = self._unclaimed.pop(ticket, None)
            if claimed is not None:
                self._in_flight -= 1
                _settle(claimed[1], None, SessionLostError("the session closed before the call started"))
        for _ in range(self._threads):
            self._tickets.put(None)

    def call_on_loop(self, callback: Callable[..., object], *args: Any) -> bool:
        """Schedule ``callback(*args)`` on the loop from any thread; False once the loop is closed."""
        try:
            self.loop.call_soon_threadsafe(callback, *args, context=_SETTLE_CONTEXT)
        except RuntimeError:
            return False
        return True

    def _serve(self) -> None:
        """A worker thread: run claimed calls until ``shutdown``'s end-of-work ticket."""
        while (ticket := self._tickets.get()) is not None:
            claimed = self._unclaimed.pop(ticket, None)
            if claimed is None:
                continue  # cancelled before it started
            call, outcome, undo = claimed
            del claimed
            try:
                result = call()
            except BaseException as exc:
                self.call_on_loop(self._finished, outcome, None, exc, None)
                del exc
            else:
                self.call_on_loop(self._finished, outcome, result, None, undo)
                del result
            del call, outcome, undo

    def _finished(
        self, outcome: asyncio.Future[T], result: T | None, error: BaseException | None, undo: Undo | None
    ) -> None:
        self._in_flight -= 1
        if undo is not None and error is None and outcome.done():  # its awaiting task was cancelled
            self._give_back(undo, result)
        _settle(outcome, result, error)


def cancelled_in_flight(write: str) -> asyncio.CancelledError:
    """What a ``write`` (its description) cancelled while in flight raises: its effect is unknown."""
    return asyncio.CancelledError(
        f"{write} was cancelled while in flight: its effect is unknown "
        "(it completes or fails by itself within request_timeout)"
    )


def _log_give_back(outcome: asyncio.Future[object]) -> None:
    error = None if outcome.cancelled() else outcome.exception()
    if error is not None and not isinstance(error, SessionLostError):
        log.warning("giving back what a cancelled call returned failed: %r", error)


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


def _never(_event: object) -> bool:
    return False


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
        sticky: Callable[[E], bool] | None = None,
        current: Callable[[], E] | None = None,
        on_finish: Callable[[EventStream[E]], None] = lambda _: None,
    ) -> None:
        self._bridge = bridge
        self._subscribe = subscribe
        self._unsubscribe = unsubscribe
        self._sticky = sticky or _never
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
