"""Where the backend keeps everything in Redis's flat key space.

Under the URL's prefix ``P`` (its path without the trailing ``/``), every
Redis key is ``P\\0<kind>\\0<name>`` (API keys, names and ids never hold a NUL,
so no two names collide), mirrored by the Lua helper ``k(...)``:

* ``kv <key>``: a hash ``v`` (value), ``n`` (version); ``ns <namespace>``: the set
  of existing keys directly below it; ``all``: every key (a sorted set, for ``walk``);
* ``rev``: the version counter (also orders candidates); ``seq`` and ``changes``:
  the change stream and its entry counter;
* ``s <session>``: the session key, with a TTL; ``leases``: sessions by expiry
  time (server clock, ms); ``o <session>``: what the session holds;
* ``g <group>`` / ``go <group>``: member -> data / member -> session;
* ``c <service>`` (candidates by nomination order), ``co <service>``
  (candidate -> session), ``t <service>`` (the term counter), ``l <service>``
  (the leader: ``id``, ``term``); ``ceiling``: the highest term of any service,
  once asked for;
* ``sealed``: present while a migration has sealed the store (``consensus_redis.seal``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Layout:
    """The Redis key names of one backend prefix."""

    prefix: str

    @classmethod
    def from_path(cls, path: str) -> Layout:
        """The layout for a URL path such as ``/myapp``."""
        return cls(path.rstrip("/"))

    def key(self, *parts: str) -> bytes:
        """The Redis key ``prefix\\0part\\0part...``."""
        return "\0".join((self.prefix, *parts)).encode()
