"""``python -I -S _orphan_guard.py PARENT_PID CMD...``: exec CMD so that it gets SIGTERM if process
PARENT_PID (the ``consensus lock`` or ``elect`` that started it) dies, even by SIGKILL.

Linux only: the parent-death signal (``prctl(PR_SET_PDEATHSIG)``) survives the
exec, so CMD keeps this process's pid and nothing else of this guard. Run by
path, without the package: it imports only the standard library. Exits 127
when CMD is not found and 126 when it cannot be run, as a shell does.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def main(parent: int, argv: list[str]) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) != 0:
        print(f"consensus: prctl: {os.strerror(ctypes.get_errno())}", file=sys.stderr)
        return 126
    if os.getppid() != parent:  # the parent died before the signal was armed
        return 128 + signal.SIGTERM
    # Python ignores these; an exec keeps ignored signals ignored, so CMD gets the defaults back.
    for ignored in (signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(ignored, signal.SIG_DFL)
    try:
        os.execvp(argv[0], argv)
    except FileNotFoundError:
        print(f"consensus: {argv[0]}: command not found", file=sys.stderr)
        return 127
    except OSError as exc:
        print(f"consensus: {argv[0]}: {exc.strerror or exc}", file=sys.stderr)
        return 126


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), sys.argv[2:]))
