"""The machinery that runs a coordinated group on a session's storage, membership and election.

Used by :class:`~consensus_api.coordinator.Coordinator` where the backend has no
engine of its own (:mod:`.engine`, :mod:`.arbiter`, :mod:`.records`,
:mod:`.negotiation`) and by every
:class:`~consensus_api.coordinator.IncrementalCoordinator` (:mod:`.steward`,
:mod:`.reconcile`). Both groups seat their members with :mod:`.seat`; the
elected member runs the group's bookkeeping (:mod:`.elected`); :mod:`.loop`
holds the threads and listener mirrors they share. Internal: no name here is
part of the public API.
"""
