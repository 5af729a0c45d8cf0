"""The history format: one row per event, stored as Parquet (see docs/history-format.md).

Every row has the same columns; a column that does not apply is null. Rows of
one operation share ``op_id``: an ``invoke`` row and at most one completion
(``ok``, ``fail`` or ``info``). ``time_ns`` is ``time.monotonic_ns()``, which
is one system-wide clock on Linux, so rows of different processes compare.
"""

from __future__ import annotations

from typing import Any, Final

import pyarrow as pa

# Row types.
INVOKE: Final = "invoke"
OK: Final = "ok"
FAIL: Final = "fail"
INFO: Final = "info"
EVENT: Final = "event"
COMPLETIONS: Final = frozenset({OK, FAIL, INFO})

# Kinds: which object a row belongs to.
KV: Final = "kv"
ELECTION: Final = "election"
GROUP: Final = "group"
SESSION: Final = "session"
NEMESIS: Final = "nemesis"
#: The coordinator workload's ownership events (``consensus_chaos.record.ownership``): ``f`` is
#: subscribed / assigned / revoked / final; ``key`` the resource, ``value`` the member id, ``term``
#: the generation, ``members`` the resources (subscribed, final).
COORDINATOR: Final = "coordinator"
#: The locks workload's rows (``consensus_chaos.record.locks``): ``acquire`` / ``release`` operations
#: and ``lost`` events; ``key`` the lock, ``value`` the mode, ``term`` the token, ``leader`` the holder.
LOCK: Final = "lock"
#: The cutover workload's client rows (``consensus_chaos.record.cutover``), on bridged sessions: CAS
#: increments (``read``, ``cas``), elections (``nominate``, ``resign``, ``leadership``, ``leader``
#: events), locks (``acquire``, ``release``, ``lost`` events) and fenced ``write`` operations; ``store``
#: says which side served each (``old`` / ``new``).
CUTOVER: Final = "cutover"
#: The migration driver's rows in a cutover run (process ``MIGRATION_PROCESS``): the ``cutover``
#: operation, and ``final`` events, the new store's state read directly at the end.
MIGRATION: Final = "migration"

# Operations (``f``): kv fetch/put/update/delete, these election ops, group join/leave/members.
ELECTION_OPS: Final = frozenset({"nominate", "resign", "leadership"})
READS: Final = frozenset({"fetch", "leadership", "members"})  # never change state

# Events (``type == "event"``): listener deliveries and the observer's markers.
VALUE_EVENT: Final = "value"  # ValueChanged (kv)
LEADER_EVENT: Final = "leader"  # LeaderChanged (election)
VIEW_EVENT: Final = "view"  # MembershipChanged (group)
WATCH: Final = "watch"  # a listener was registered
UNWATCH: Final = "unwatch"  # a listener was removed
FINAL: Final = "final"  # after quiescence: the observer's direct read of the final state
STATE_EVENT: Final = "state"  # a session state change (kind "session")

#: Terms and tokens are stored as BIGINT by external resources: every one must stay below this.
TOKEN_LIMIT: Final = 2**63
#: The ``error`` of an ``ok`` row whose term does not fit the int64 ``term`` column (``: N`` follows).
OUT_OF_RANGE: Final = "term out of range"

NEMESIS_PROCESS: Final = -1
MIGRATION_PROCESS: Final = -2
#: ``store`` values: the migration's source and target.
OLD_STORE: Final = "old"
NEW_STORE: Final = "new"

#: Column name -> Arrow type name, in file order.
COLUMNS: Final[dict[str, str]] = {
    "run": "string",
    "backend": "string",
    "kind": "string",
    "process": "int64",
    "client": "int64",
    "type": "string",
    "f": "string",
    "key": "string",
    "value": "string",
    "version": "int64",
    "expected_version": "int64",
    "term": "int64",
    "service": "string",
    "leader": "string",
    "members": "list<string>",
    "op_id": "int64",
    "error": "string",
    "time_ns": "int64",
    "store": "string",
}


def arrow_schema() -> Any:
    """The Arrow schema of a history file."""
    types = {"string": pa.string(), "int64": pa.int64(), "list<string>": pa.list_(pa.string())}
    return pa.schema([(name, types[kind]) for name, kind in COLUMNS.items()])
