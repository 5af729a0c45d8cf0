"""Child processes of the benchmarks: joiners, leaders to SIGKILL, and scale hosts.

    python -m benchmarks.child MODE ARGS... --lifetime S

A child of the harness (:mod:`consensus_api.children`, parent side ``benchmarks.procs``): an
argument ``-`` stands for the URL in ``$CONSENSUS_URL``. Modes (``KIND`` is ``ours``, ``tooz`` or
``kazoo``; URLs are tooz URLs for ``tooz``):

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
``observe URL GROUP SIZE`` / ``join URL GROUP SIZE SESSIONS``
    see ``benchmarks.scale_observers``; print ``READY``, then ``RESULT <json>`` after ``START``.

Every wait is bounded; a failure prints ``ERROR <text>`` and exits 1.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

from kazoo.client import KazooClient

from benchmarks import scale_observers, tooz_baseline
from benchmarks.core import EVENT_TIMEOUT, wait_for
from benchmarks.scale import host
from consensus_api import LeaderChanged, connect
from consensus_api.children import Parent, say
from consensus_api.config import ENV_URL

#: How long the watchdog lets a child run past its lifetime (or after stdin closed): as long as the
#: parent waits for a scale host's result beyond it.
GRACE = 30.0


def joiner(kind: str, url: str, group: str, member: str, parent: Parent) -> None:
    """See the module docstring."""
    if kind == "tooz":
        coord = tooz_baseline.coordinator(url, member)
        tooz_baseline.create_group(coord, group)
        say("READY")
        while (line := parent.next()) is not None:
            command = line.split()[0]
            if command == "JOIN":
                start = time.monotonic()
                coord.join_group(group.encode()).get()
                say("JOINED", repr(start))
            elif command == "LEAVE":
                coord.leave_group(group.encode()).get()
                say("LEFT")
        tooz_baseline.stop(coord)
        return
    with connect(url) as session:
        handle = session.group(group)
        say("READY")
        while (line := parent.next()) is not None:
            command, name = line.split()
            if command == "JOIN":
                start = time.monotonic()
                handle.join(name)
                say("JOINED", repr(start))
            elif command == "LEAVE":
                handle.leave(name)
                say("LEFT")


def candidate(kind: str, url: str, name: str, timeout: float, me: str, *, parent: Parent) -> None:
    """See the module docstring."""
    leads = threading.Event()

    def lead() -> None:
        if not leads.is_set():
            leads.set()
            say("LEADS", repr(time.monotonic()))

    if kind == "ours":
        session = connect(url, session_timeout=timeout)
        election = session.election(name)

        def on_change(event: LeaderChanged) -> None:
            if event.leader_id == me:
                lead()

        election.add_listener(on_change)
        election.nominate(me)
    elif kind == "tooz":
        coord = tooz_baseline.coordinator(url, me)
        tooz_baseline.create_group(coord, name)
        coord.watch_elected_as_leader(name.encode(), lambda event: lead())
        tooz_baseline.Pump(coord)
    else:
        client = KazooClient(hosts=url, timeout=timeout)
        client.start(timeout=EVENT_TIMEOUT)
        election = client.Election(name, me)

        def hold() -> None:
            lead()
            time.sleep(max(0.0, parent.deadline - time.monotonic()))

        threading.Thread(target=election.run, args=(hold,), daemon=True).start()
        if not wait_for(lambda: me in election.contenders(), EVENT_TIMEOUT, interval=0.02):
            raise RuntimeError("the kazoo candidate did not queue up")
    say("QUEUED")
    while parent.next() is not None:
        pass


def main(argv: list[str] | None = None) -> None:
    """Parse the mode and run it; ``ERROR`` and exit status 1 on any failure."""
    parser = argparse.ArgumentParser(prog="benchmarks.child")
    parser.add_argument("mode", choices=("joiner", "candidate", "scale", "observe", "join"))
    parser.add_argument("args", nargs="*")
    parser.add_argument("--lifetime", type=float, default=900.0)
    options = parser.parse_args(argv)
    parent = Parent(options.lifetime, grace=GRACE)
    args = [os.environ[ENV_URL] if arg == "-" else arg for arg in options.args]
    try:
        if options.mode == "joiner":
            joiner(args[0], args[1], args[2], args[3] if len(args) > 3 else "member", parent)
        elif options.mode == "candidate":
            candidate(args[0], args[1], args[2], float(args[3]), args[4], parent=parent)
        elif options.mode == "observe":
            say("RESULT", scale_observers.observe(args[0], args[1], int(args[2]), parent))
        elif options.mode == "join":
            scale_observers.join(args[0], args[1], int(args[2]), int(args[3]), parent)
        else:
            say("RESULT", host(args[0], args[1], int(args[2]), int(args[3]), parent.deadline))
    except Exception as exc:
        say("ERROR", f"{type(exc).__name__}: {exc}")
        sys.exit(1)


if __name__ == "__main__":
    main()
