"""Where the Kafka backend keeps everything: its topic and groups, named below the URL's prefix.

The prefix ``P`` is the URL's path with ``/`` as ``.`` (``consensus`` for none):

* ``P.kv``: the single-partition topic holding the command log (``commandlog``):
  every stored key and value, and the leases of elections (``state``);
* ``P.members``: the one Kafka group carrying the members of every membership
  group, as entries of one Kafka member per session (``protocol``);
* ``P.election.<service>``: a Kafka group per election, a Kafka member per candidate;
* ``P.coordinator.<group>``: a Kafka group per Coordinator group (``coordinator``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from consensus_api.errors import ConfigurationError

DEFAULT_PREFIX = "consensus"
_PREFIX_RE = re.compile(r"[A-Za-z0-9._-]{1,200}")


@dataclass(frozen=True, slots=True)
class Layout:
    """The topic and group names of one backend prefix."""

    prefix: str

    @classmethod
    def from_path(cls, path: str) -> Layout:
        """The layout for a URL path such as ``/app/one`` (prefix ``app.one``); ``ConfigurationError``
        for a path that cannot name topics and groups."""
        stripped = path.strip("/")
        prefix = stripped.replace("/", ".") if stripped else DEFAULT_PREFIX
        if not _PREFIX_RE.fullmatch(prefix):
            raise ConfigurationError(
                "the kafka:// URL path names the topic prefix: 1-200 characters of A-Z a-z 0-9 . _ - "
                f"(segments joined by '/'), got {path!r}"
            )
        return cls(prefix)

    @property
    def topic(self) -> str:
        """The single-partition topic holding the command log."""
        return f"{self.prefix}.kv"

    @property
    def members_group(self) -> str:
        """The one Kafka group carrying the members of every membership group (as entries)."""
        return f"{self.prefix}.members"

    def election_id(self, service: str) -> str:
        """The Kafka group id of an election."""
        return f"{self.prefix}.election.{service}"

    def coordinator_id(self, group: str) -> str:
        """The Kafka group id of a Coordinator group."""
        return f"{self.prefix}.coordinator.{group}"
