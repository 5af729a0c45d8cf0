"""The ledger: which target values the migration wrote, kept on the target itself.

Below the reserved namespace ``.consensus-migrate`` each record is one key
holding JSON ``{"v": 1, "owned": {<key digest>: [<before>, <after>]}}``:
before writing a batch, the migration records, per key, the digest of the
target's value it is about to replace (``before``; null: absent) and of the
value it writes (``after``; null: a delete). A target value is *owned* by
the migration when its digest is the ``before`` or ``after`` of the key's
latest record (or, for a key never recorded, when the key is absent). So a
crash between the record and the write leaves the key owned either way. Once
the write is done a later record confirms it as ``[<after>, <after>]``, so a
value (or a deletion) someone else made afterwards is never owned: the
migration does not clobber it. Records are written in order by one thread at
a time; their names sort by time.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
import uuid
from collections.abc import Mapping

from consensus_api.errors import ConsensusError
from consensus_api.floor import RESERVED_KEYS
from consensus_api.keys import SEPARATOR
from consensus_api.storage import Storage

#: The target namespace that holds the ledger; never copied, walked or compared.
LEDGER = ".consensus-migrate"

#: Keys per record (a record stays far below the 1 MiB value limit).
RECORD_LIMIT = 2000

#: The digest of a value, or None for "absent".
Digest = str | None


def digest(value: bytes | None) -> Digest:
    """A 128-bit BLAKE2b digest of ``value`` in hex; None for None."""
    return None if value is None else hashlib.blake2b(value, digest_size=16).hexdigest()


def reserved(key: str) -> bool:
    """Whether ``key`` is the ledger or below it, or a key of the bridged migration (the term floor,
    the marker): never copied or compared."""
    return key == LEDGER or key.startswith(LEDGER + SEPARATOR) or key in RESERVED_KEYS


def _key_digest(key: str) -> str:
    return hashlib.blake2b(key.encode("utf-8"), digest_size=16, person=b"key").hexdigest()


class Ledger:
    """The ownership records on one target; ``load`` once, then ``owns`` and ``record``."""

    def __init__(self, storage: Storage) -> None:
        self._storage = storage
        self._owned: dict[str, tuple[Digest, Digest]] = {}
        self._lock = threading.Lock()
        self._sequence = 0
        self._run = uuid.uuid4().hex[:12]

    def load(self) -> int:
        """Read every record (oldest first; later ones win); returns how many there were."""
        records = sorted(self._storage.walk(LEDGER), key=lambda item: item[0])
        with self._lock:
            for key, found in records:
                try:
                    entries = json.loads(found.value)["owned"]
                except (ValueError, KeyError, TypeError):
                    raise ConsensusError(f"the migration ledger record {key!r} is damaged") from None
                for name, (before, after) in entries.items():
                    self._owned[name] = (before, after)
        return len(records)

    def known(self, key: str) -> bool:
        """Whether the migration ever recorded ``key``."""
        with self._lock:
            return _key_digest(key) in self._owned

    def owns(self, key: str, current: Digest) -> bool:
        """Whether the target's value of ``key`` (digest ``current``; None: absent) is the migration's."""
        with self._lock:
            entry = self._owned.get(_key_digest(key))
        return current is None if entry is None else current in entry

    def record(self, intents: Mapping[str, tuple[Digest, Digest]]) -> None:
        """Write one record of ``{key: (before, after)}``; call it before the writes it announces."""
        items = list(intents.items())
        for start in range(0, len(items), RECORD_LIMIT):
            self._record_one(
                {_key_digest(key): list(change) for key, change in items[start : start + RECORD_LIMIT]}
            )

    def _record_one(self, owned: dict[str, list[Digest]]) -> None:
        with self._lock:
            self._sequence += 1
            name = f"{LEDGER}/{time.time_ns():020d}-{self._run}-{self._sequence:08d}"
        body = json.dumps({"v": 1, "owned": owned}, separators=(",", ":")).encode()
        self._storage.put(name, body)
        with self._lock:
            for key_name, (before, after) in owned.items():
                self._owned[key_name] = (before, after)
