"""Child processes of the benchmarks: joiners, leaders to SIGKILL, and scale hosts.

    python -m benchmarks.child MODE ARGS... --lifetime S

Modes (``KIND`` is ``ours``, ``tooz`` or ``kazoo``; URLs are tooz URLs for ``tooz``):

``joiner KIND URL GROUP [MEMBER]``
    prints ``READY``; then serves ``JOIN <member>`` (prints ``JOINED <t0>``,
    ``t0`` = ``time.monotonic()`` just before the join) and ``LEAVE <member>``
    (prints ``LEFT``). tooz joins as MEMBER whatever the command names.
``candidate KIND URL NAME TIMEOUT ID``
    stands as candidate ID for leader of NAME (ours: a service; tooz: a group;
    kazoo: an election path) with a session timeout of TIMEOUT seconds; prints
    ``QUEUED`` once in line and ``LEADS <t>`` when its "you lead" callback
    runs (``t`` = ``time.monotonic()`` there); then holds on until killed,
    stdin closes or the lifetime ends.
``scale URL WORKLOAD SIZE SESSIONS``
    see ``benchmarks.scale.host``; prints ``RESULT <json>``.

Every wait is bounded; a failure prints ``ERROR <text>`` and exits 1.
"""

from __future__ import annotations

import argparse
import os
import queue
import sys
import threading
import time
from collections.abc import Iterator

from benchmarks.core import EVENT_TIMEOUT, wait_for

_print_lock = threading.Lock()


def emit(*parts: object) -> None:
    """Write one line to the parent."""
    with _print_lock:
        sys.stdout.write(" ".join(str(part) for part in parts) + "\n")
        sys.stdout.flush()


def commands(deadline: float) -> Iterator[str]:
    """stdin lines until it closes or ``deadline`` (``time.monotonic``) passes."""
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        for line in sys.stdin:
            lines.put(line.strip())
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    while (remaining := deadline - time.monotonic()) > 0:
        try:
            line = lines.get(timeout=remaining)
        except queue.Empty:
            return
        if line is None:
            return
        if line:
            yield line


def joiner(kind: str, url: str, group: str, member: str, deadline: float) -> None:
    """See the module docstring."""
    if kind == "tooz":
        from benchmarks import tooz_baseline  # noqa: PLC0415

        coord = tooz_baseline.coordinator(url, member)
        tooz_baseline.create_group(coord, group)
        emit("READY")
        for line in commands(deadline):
            command = line.split()[0]
            if command == "JOIN":
                start = time.monotonic()
                coord.join_group(group.encode()).get()
                emit("JOINED", repr(start))
            elif command == "LEAVE":
                coord.leave_group(group.encode()).get()
                emit("LEFT")
        tooz_baseline.stop(coord)
        return
    from consensus_api import connect  # noqa: PLC0415

    with connect(url) as session:
        handle = session.group(group)
        emit("READY")
        for line in commands(deadline):
            command, name = line.split()
            if command == "JOIN":
                start = time.monotonic()
                handle.join(name)
                emit("JOINED", repr(start))
            elif command == "LEAVE":
                handle.leave(name)
                emit("LEFT")


def candidate(kind: str, url: str, name: str, timeout: float, me: str, *, deadline: float) -> None:
    """See the module docstring."""
    leads = threading.Event()

    def lead() -> None:
        if not leads.is_set():
            leads.set()
            emit("LEADS", repr(time.monotonic()))

    if kind == "ours":
        from consensus_api import LeaderChanged, connect  # noqa: PLC0415

        session = connect(url, session_timeout=timeout)
        election = session.election(name)

        def on_change(event: LeaderChanged) -> None:
            if event.leader_id == me:
                lead()

        election.add_listener(on_change)
        election.nominate(me)
    elif kind == "tooz":
        from benchmarks import tooz_baseline  # noqa: PLC0415

        coord = tooz_baseline.coordinator(url, me)
        tooz_baseline.create_group(coord, name)
        coord.watch_elected_as_leader(name.encode(), lambda event: lead())
        tooz_baseline.Pump(coord)
    else:
        from kazoo.client import KazooClient  # noqa: PLC0415

        client = KazooClient(hosts=url, timeout=timeout)
        client.start(timeout=EVENT_TIMEOUT)
        election = client.Election(name, me)

        def hold() -> None:
            lead()
            time.sleep(max(0.0, deadline - time.monotonic()))

        threading.Thread(target=election.run, args=(hold,), daemon=True).start()
        if not wait_for(lambda: me in election.contenders(), EVENT_TIMEOUT, interval=0.02):
            raise RuntimeError("the kazoo candidate did not queue up")
    emit("QUEUED")
    for _ in commands(deadline):
        pass


def main(argv: list[str] | None = None) -> None:
    """Parse the mode and run it; ``ERROR`` and exit status 1 on any failure."""
    parser = argparse.ArgumentParser(prog="benchmarks.child")
    parser.add_argument("mode", choices=("joiner", "candidate", "scale"))
    parser.add_argument("args", nargs="*")
    parser.add_argument("--lifetime", type=float, default=900.0)
    options = parser.parse_args(argv)
    deadline = time.monotonic() + options.lifetime
    args = [os.environ[arg[4:]] if arg.startswith("env:") else arg for arg in options.args]
    try:
        if options.mode == "joiner":
            joiner(args[0], args[1], args[2], args[3] if len(args) > 3 else "member", deadline)
        elif options.mode == "candidate":
            candidate(args[0], args[1], args[2], float(args[3]), args[4], deadline=deadline)
        else:
            from benchmarks.scale import host  # noqa: PLC0415

            emit("RESULT", host(args[0], args[1], int(args[2]), int(args[3]), deadline))
    except Exception as exc:
        emit("ERROR", f"{type(exc).__name__}: {exc}".replace("\n", " "))
        sys.exit(1)


if __name__ == "__main__":
    main()
