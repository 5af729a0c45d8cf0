"""Moving the keys under a prefix from one backend to another: copy, follow, verify (docs/migration.md).

```python
from consensus_api.migrate import migrate

report = migrate("zookeeper://zk:2181/app", "etcd://etcd:2379/app")      # copy
migrate("zookeeper://zk:2181/legacy", "postgresql://db/app", raw=True)    # any ZooKeeper tree
migrate(source, target, follow=True, stop=event)                          # copy, then follow changes
assert not migrate(source, target, verify=True).differences               # compare only
cutover(old, new); rollback(old, new); status(old, new)                   # the bridged cut-over
```

The bridged migration (sessions that follow a cut-over by themselves, the term floor):
``consensus_api.migrate.bridge`` and docs/migration.md.

Guarantees:

* Values arrive byte for byte; only keys (storage) are copied, never
  members, candidates or leadership: clients re-join on the new backend.
* Every target write is conditional on the target state it was decided on,
  and announced first in a ledger on the target (``.consensus-migrate``), so
  an interrupted run can be run again: it creates what is missing, updates
  only values the migration itself wrote, deletes keys it copied that the
  source no longer has, and never clobbers a value someone else wrote.
* A first run refuses a target that already holds different data under the
  prefix (``MigrationConflictError``) unless ``overwrite=True``, which makes
  the target's prefix a copy of the source's (deleting keys only the target has).
* Paths the target cannot hold (raw mode: segments over 255 characters,
  keys over 1024 bytes, values over 1 MiB) are reported, never dropped silently.
"""

from consensus_api.migrate.copier import Action
from consensus_api.migrate.copying import Difference, Migration, MigrationConflictError, Report, migrate
from consensus_api.migrate.cutover import CutoverRefusedError, RollbackRefusedError, cutover, rollback
from consensus_api.migrate.ledger import LEDGER
from consensus_api.migrate.status import MigrationStatus, status

__all__ = [
    "LEDGER",
    "Action",
    "CutoverRefusedError",
    "Difference",
    "Migration",
    "MigrationConflictError",
    "MigrationStatus",
    "Report",
    "RollbackRefusedError",
    "cutover",
    "migrate",
    "rollback",
    "status",
]
