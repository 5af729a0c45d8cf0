"""A child of the harness for ``tests/test_children.py``:
``python -m children_child [--grace S] --lifetime S``.

It prints ``READY``, then answers each command: ``URL`` (``URL <$CONSENSUS_URL>``), ``PING``
(``PONG``), ``SLEEP`` (sleeps, answering nothing more: only its watchdog ends it); ``STOP`` is its
stop word. It prints ``BYE`` once told to stop, its stdin closed or its lifetime over.
"""

from __future__ import annotations

import argparse
import os
import time

from consensus_api.children import Parent, say
from consensus_api.config import ENV_URL


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--grace", type=float, default=5.0)
    parser.add_argument("--lifetime", type=float, required=True)
    args = parser.parse_args()
    parent = Parent(args.lifetime, grace=args.grace, stop_words=("STOP",))
    say("READY")
    while not parent.stop.is_set() and (line := parent.next()) is not None:
        if line == "URL":
            say("URL", os.environ.get(ENV_URL, "-"))
        elif line == "PING":
            say("PONG")
        elif line == "SLEEP":
            time.sleep(3600)
    say("BYE")


if __name__ == "__main__":
    main()
