"""A migration's seal of the store, the terms it has issued, and its live sessions.

The seal is the key ``sealed`` under the prefix, set and deleted by one command
each. Every storage script (``scripts.PUT``, ``UPDATE``, ``DELETE``) refuses
first thing while it exists. Redis runs a script alone, between two commands,
so a write racing ``seal`` runs wholly before the ``SET`` (applied, before
``seal`` returns) or wholly after it (refused: ``SealedError``): atomic with
the write, for the price of one ``EXISTS`` inside the script. Members,
candidates and reads never look at it.

Terms: each service's term counter (``t <service>``) is never deleted and only
grows; lock tokens are terms. ``ceiling`` holds the highest of them: ``elect``
raises it with every new term once it exists, and the first ``term_ceiling``
makes it from every counter under the prefix (``scripts.TERM_CEILING``), so it
counts terms issued before it existed and never goes down.

Sessions: a session is its key ``s <id>``, which Redis expires by its own clock;
the live ones are those of the ``leases`` index whose key still exists.
"""

from __future__ import annotations

from consensus_redis import scripts
from consensus_redis.client import RedisClient, Script
from consensus_redis.layout import Layout

TERM_CEILING, LIVE_SESSIONS = Script(scripts.TERM_CEILING), Script(scripts.LIVE_SESSIONS)


class Seal:
    """The seal, term ceiling and live sessions of one prefix; each call is one request, bounded by
    ``request_timeout``."""

    def __init__(self, client: RedisClient, layout: Layout) -> None:
        self._client = client
        self._layout = layout
        self._key = layout.key("sealed")

    def seal(self) -> None:
        """Refuse every storage write of every session from now on (idempotent)."""
        self._client.command("SET", self._key, "1", write=True)

    def unseal(self) -> None:
        """Accept storage writes again (idempotent)."""
        self._client.command("DEL", self._key, write=True)

    def sealed(self) -> bool:
        """Whether the store is sealed (one read on the one server: linearizable)."""
        return bool(self._client.command("EXISTS", self._key))

    def term_ceiling(self) -> int:
        """The highest term any service under the prefix has had (0 before the first election)."""
        return int(self._client.run(TERM_CEILING, self._layout.prefix)[1])

    def live_sessions(self) -> frozenset[str]:
        """The ids of the sessions whose key has not expired."""
        reply = self._client.run(LIVE_SESSIONS, self._layout.prefix, write=False)
        return frozenset(sid.decode() for sid in reply[1])
