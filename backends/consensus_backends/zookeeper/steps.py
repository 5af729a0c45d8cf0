"""Operations as steps: their logic without their I/O, driven by blocking or awaited requests.

A step is a generator that yields ``Requests`` (one pipelined batch, as
``client.Pipeline.run`` or ``read`` sends it), is sent the batch's outcomes (or
thrown the ``ConsensusError`` the batch raised) and returns the operation's
result. ``drive`` runs it with blocking requests (the backend's calls);
``aio.AsyncPipeline`` with awaited ones (``aio.AsyncStorage``): one
implementation of each operation's rules, two kinds of I/O.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, TypeVar

from consensus_api.errors import ConsensusError
from consensus_backends.zookeeper.client import Build
from consensus_backends.zookeeper.lease import Connection

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Requests:
    """One batch: what ``build`` starts on the client, in order, pipelined.

    ``idempotent``: re-sent after a connection problem until the deadline.
    ``barrier``: a linearizable read (``Pipeline.read``) behind a no-op quorum write on that path.
    """

    build: Build
    idempotent: bool = True
    barrier: str | None = None


Steps = Generator[Requests, list[Any], T]


def send(build: Build, *, idempotent: bool = True, barrier: str | None = None) -> Steps[list[Any]]:
    """The step that sends one batch and returns its outcomes (``yield from send(...)``)."""
    return (yield Requests(build, idempotent, barrier))


def drive(connection: Connection, steps: Steps[T], deadline: float) -> T:
    """Run ``steps`` with blocking requests on ``connection``, each bounded by ``deadline``."""
    try:
        requests = next(steps)
        while True:
            try:
                if requests.barrier is not None:
                    outcomes = connection.read(requests.build, deadline, barrier=requests.barrier)
                else:
                    outcomes = connection.run(requests.build, deadline, idempotent=requests.idempotent)
            except ConsensusError as exc:
                requests = steps.throw(exc)
            else:
                requests = steps.send(outcomes)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
