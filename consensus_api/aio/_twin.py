"""How an aio object follows the synchronous one it stands for: by construction.

Every aio recipe is a :class:`Twin` of a synchronous recipe (``Twin[Lock]``) and
holds one, which does the work: one implementation of the rules. Its methods
are built from the synchronous ones, so they keep their names, parameters,
docstrings, results and errors:

* a method that may block has an ``async def`` twin that runs it on one of the
  session's worker threads (:func:`awaited`);
* a method that only reads memory or signals a thread has a plain twin that
  calls it right away (:func:`immediate`);
* an ``add_*listener`` / ``remove_*listener`` pair has one method returning an
  ``EventStream`` of the same events (:meth:`SessionLoop.stream`);
* ``with`` becomes ``async with``.

tests/test_aio_surface.py holds every public method of every synchronous recipe
to these rules, so a synchronous method without its twin fails there.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Coroutine
from functools import partial
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar

from consensus_api.aio._bridge import Bridge, Callback, EventStream

S_co = TypeVar("S_co", covariant=True)
P = ParamSpec("P")
T = TypeVar("T")
E = TypeVar("E")


class SessionLoop:
    """One aio session's side of its event loop: the bridge its calls run through, and its open
    event streams (each ends when the session closes)."""

    def __init__(self, bridge: Bridge, closed: Callable[[], bool]) -> None:
        self.bridge = bridge
        self._closed = closed
        self._streams: set[EventStream[Any]] = set()

    def stream(
        self,
        subscribe: Callable[[Callback[E]], None],
        unsubscribe: Callable[[Callback[E]], None],
        *,
        sticky: Callable[[E], bool] | None = None,
        current: Callable[[], E] | None = None,
    ) -> EventStream[E]:
        """A new stream of the events ``subscribe`` delivers (``EventStream``), ended when the
        session closes (at once if it is closed)."""
        created: EventStream[E] = EventStream(
            self.bridge,
            subscribe,
            unsubscribe,
            sticky=sticky,
            current=current,
            on_finish=self._streams.discard,
        )
        if self._closed():
            created.finish()
        else:
            self._streams.add(created)
        return created

    def end_streams(self) -> None:
        """Stop every open stream after its held events (the session closed)."""
        for stream in list(self._streams):
            stream.finish()


class Twin(Generic[S_co]):
    """The asyncio twin of a synchronous recipe ``S_co``, which it holds (``_sync``) and which does
    the work; tests/test_aio_surface.py pairs the two by this base."""

    def __init__(self, sync: S_co) -> None:
        self._sync = sync


class SessionTwin(Twin[S_co]):
    """A twin handed out by an aio session: its calls and streams go through the session's loop."""

    def __init__(self, sync: S_co, loop: SessionLoop) -> None:
        super().__init__(sync)
        self._loop = loop


def awaited(
    method: Callable[Concatenate[S_co, P], T],
    *,
    write: str | None = None,
    undo: Callable[[S_co, T], object] | None = None,
) -> Callable[Concatenate[SessionTwin[S_co], P], Coroutine[Any, Any, T]]:
    """The ``async def`` twin of ``method``, which may block: the twin's synchronous object runs it
    on a worker thread (``Bridge.run``: a ``write`` names it for a cancellation while in flight;
    ``undo(sync, result)`` gives back what such a cancelled call returned)."""

    @functools.wraps(method)
    async def twin(self: SessionTwin[S_co], /, *args: P.args, **kwargs: P.kwargs) -> T:
        sync = self._sync
        give_back = None if undo is None else partial(undo, sync)
        return await self._loop.bridge.run(
            partial(method, sync, *args, **kwargs), write=write, undo=give_back
        )

    return twin


def immediate(method: Callable[Concatenate[S_co, P], T]) -> Callable[Concatenate[Twin[S_co], P], T]:
    """The plain twin of ``method``, which never blocks (it reads memory or signals a thread)."""

    @functools.wraps(method)
    def twin(self: Twin[S_co], /, *args: P.args, **kwargs: P.kwargs) -> T:
        return method(self._sync, *args, **kwargs)

    return twin
