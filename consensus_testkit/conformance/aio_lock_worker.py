"""A child process holding a lock through ``consensus_api.aio``, for the ``aio`` section, and its
parent's handle.

Child side::

    python -m consensus_testkit.conformance.aio_lock_worker URL hold NAME \
        [--opt NAME=VALUE]... [--lifetime S]

``URL`` may be ``-`` to read it from ``$CONSENSUS_URL``. Like ``lock_worker hold``,
through an aio session: it reports every state (``STATE <NAME>``, from
``session.states()``) and a lost lease (``LOST <token>``, from ``lock.watch()``),
acquires the lock and prints ``HELD <token>``; then it serves ``FENCED
put|update|delete KEY`` (the awaited write fenced by the lease held: ``FENCED <op>
ok|fenced|<error class> <seconds>``) and ``EXIT``.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from consensus_api import ConsensusError, FencedError, Lease, aio
from consensus_api.children import Parent, say
from consensus_testkit.conformance.child import ChildProcess, child_parser, child_start
from consensus_testkit.conformance.helpers import EVENT_TIMEOUT

E = TypeVar("E")
MODULE = "consensus_testkit.conformance.aio_lock_worker"


async def _report(stream: aio.EventStream[E], line: Callable[[E], tuple[object, ...]]) -> None:
    async for event in stream:
        say(*line(event))


async def _fenced(session: aio.AsyncSession, lease: Lease, operation: str, key: str) -> None:
    storage, value = session.storage, b"stale holder"
    start = time.monotonic()
    try:
        if operation == "put":
            await storage.put(key, value, fence=lease)
        elif operation == "update":
            await storage.update(key, value, fence=lease)
        else:
            await storage.delete(key, fence=lease)
        outcome = "ok"
    except FencedError:
        outcome = "fenced"
    except ConsensusError as exc:
        outcome = type(exc).__name__
        print(f"fenced {operation} {key}: {outcome}: {exc}", file=sys.stderr, flush=True)
    say("FENCED", operation, outcome, f"{time.monotonic() - start:.3f}")


async def _hold(url: str, options: dict[str, Any], parent: Parent, name: str) -> int:
    async with aio.connect(url, **options) as session:
        lock = session.lock(name)
        reporters = [
            asyncio.create_task(_report(session.states(), lambda state: ("STATE", state.name))),
            asyncio.create_task(_report(lock.watch(), lambda lost: ("LOST", lost.token))),
        ]
        lease = await lock.acquire(timeout=EVENT_TIMEOUT)
        if lease is None:
            say("ERROR Timeout the lock was not acquired")
            return 2
        say("HELD", lease.token)
        while (line := await asyncio.to_thread(parent.next)) is not None:
            command, _, argument = line.partition(" ")
            if command == "EXIT":
                break
            if command == "FENCED":
                await _fenced(session, lease, *argument.split(" ", 1))
            else:
                say("ERROR unknown command", command)
        for reporter in reporters:
            reporter.cancel()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; the exit code is 0 when it completed."""
    parser, common, commands = child_parser(MODULE)
    commands.add_parser("hold", parents=[common]).add_argument("name")
    args = parser.parse_args(argv)
    parent, options = child_start(args)
    url = os.environ.get("CONSENSUS_URL", "") if args.url == "-" else args.url
    try:
        return asyncio.run(_hold(url, options, parent, args.name))
    except ConsensusError as exc:
        say("ERROR", type(exc).__name__, exc)
        return 1


class AioLockWorker(ChildProcess):
    """The parent's handle on one aio lock worker."""

    def __init__(
        self, url: str, args: Sequence[str], options: Mapping[str, object], lifetime: float = 120.0
    ) -> None:
        super().__init__(MODULE, ["-", *args], url, options, lifetime, name=f"aio lock worker {args[0]}")


if __name__ == "__main__":
    sys.exit(main())
