"""A tooz driver on consensus-api: ``tooz.coordination.get_coordinator("consensus+<URL>", member_id)``.

``<URL>`` is any consensus-api URL (``consensus+zookeeper://host:2181/app``,
``consensus+etcd://…``, ``consensus+sqlite:////path.db``,
``consensus+postgresql://…``, ``consensus+kafka://…``); its query takes this
API's options plus tooz's ``timeout`` (seconds, default 30). Registered in
tooz's entry point group ``tooz.backends`` (extra ``tooz``).

What it gives a tooz application, and how:

* **Groups** are a stored key each (``_tooz/groups/<hex id>``); members are
  ephemeral members of this API's groups (they die with the session), their
  capabilities msgpack-encoded in the member's data (updates in
  ``_tooz/overrides``). A ``leave_group`` for a member that another
  coordinator with the same member id holds boots it out: that coordinator
  leaves at its next ``run_watchers`` or ``heartbeat``.
* **Watchers** are fed by this API's push events (no polling): the events
  arrive on the session's dispatcher thread and are kept; ``run_watchers``
  runs the join/leave hooks for what changed since its last run. Leadership is
  read (linearizably) at each ``run_watchers``.
* **Elections** are this API's elections (``watch_elected_as_leader`` stands
  as a candidate; ``stand_down_group_leader`` resigns and queues again).
* **Locks** are fenced locks (``ConsensusLock.lease`` is a fencing token for
  ``Storage`` writes), exclusive or shared, served in arrival order.
* **Heartbeat**: ``requires_beating`` is True. A coordinator that does not
  call ``heartbeat()`` (``start(start_heart=True)`` does) for ``timeout``
  seconds is expired: its session is closed, so its members, candidacies and
  locks are released, as tooz's timeout-based drivers do.
"""

from consensus_api.tooz_driver._lock import ConsensusLock
from consensus_api.tooz_driver.driver import ConsensusDriver

__all__ = ["ConsensusDriver", "ConsensusLock"]
