"""The bridged migration between two backends.

Contract: <https://consensus-api.github.io/consensus-api/spec/#14-migration-between-backends>

In short:

```python
import consensus_api as ca
from consensus_api.migrate import cutover, rollback, status

# 1. Applications connect bridged: the whole API, sent to whichever store has authority.
session = ca.connect(OLD, migrate_to=NEW)        # also consensus.toml `migrate_to`, env CONSENSUS_MIGRATE_TO
                                                 # (the env applies when the URL itself comes from env/config)
                                                 # and consensus_api.aio.connect(OLD, migrate_to=NEW)

# 2. Operators move authority; each returns a ``Marker`` (the state written).
cutover(OLD, NEW, force=False, timeout=60.0, max_lag=1000, options=None)  # -> Marker
rollback(OLD, NEW, options=None)                                            # -> Marker
st = status(OLD, NEW, options=None)                                         # -> MigrationStatus
st.phase, st.authority, st.bridged_old, st.bridged_new, st.unbridged, st.lag, st.floor_old, st.floor_new
```

CLI: ``consensus migrate cutover|rollback|status --from OLD --to NEW`` (cutover: ``--force``,
``--timeout``, ``--max-lag``; ``status --json``); ``consensus migrate --from OLD --to NEW
[--follow ...]`` still copies.

Errors (all ``ConsensusError``): ``CutoverRefusedError`` (unbridged live sessions, data not in sync,
a store that cannot list sessions without ``force``, wrong phase), ``RollbackRefusedError`` (NEW
accepted a write since the cut-over; the message says which check failed); bad arguments raise
``ConfigurationError`` before any I/O. ``SealedError`` reaches only plain (unbridged) sessions.

What a bridged session's user sees at a cut-over (and a roll-back): the session reports ``LOST``
when the cut-over begins (it parks: leaders get ``LeaderChanged(None)`` first, lock holders
``LockLost``), then ``CONNECTED`` on NEW, where members re-join and candidates re-nominate; every
term, lock token and version on NEW is greater than any it heard of on OLD (the floor,
``consensus_api.floor``); a fenced write carrying an OLD leadership raises ``FencedError``; an
unfenced write waits for the outcome and lands on the store that has authority.

Reserved keys (never copied): ``_consensus/term-floor`` (``FLOOR_KEY``) and ``_consensus/migration``
(``MARKER_KEY``, JSON ``Marker``); bridged sessions are members of group ``_consensus/bridged``
(``BRIDGED_GROUP``) with data JSON ``{"host", "pid", "session", "bridged": true, "role", "parked"}``.
"""

from __future__ import annotations

from consensus_api.bridging import BRIDGED_GROUP, BridgeBackend, Marker
from consensus_api.floor import FLOOR_KEY, MARKER_KEY

__all__ = ["BRIDGED_GROUP", "FLOOR_KEY", "MARKER_KEY", "BridgeBackend", "Marker"]
