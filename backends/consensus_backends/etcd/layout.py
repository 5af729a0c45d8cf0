"""Where the backend keeps everything in etcd's flat key space.

Under the URL's prefix ``P`` (its path without the trailing ``/``):

* ``P/kv/<key>``: a stored key (one etcd key per API key; no intermediate keys);
* ``P/groups/<group>/<member_id>``: a member, bound to its session's lease;
* ``P/elections/<service>/<candidate_id>``: a candidate, bound to its session's lease;
* ``P/migration/seal``: exists while the store is sealed by a migration (``seal``);
* ``P/migration/sessions/<lease id>``: one per live session, bound to its lease (``seal``).

Group and service names may contain ``/``; in the two last forms they are
written with ``%`` as ``%25`` and ``/`` as ``%2F``, so the prefix range of one
group or service never holds the entries of another (``a`` and ``a/b``).
Member and candidate ids never contain ``/``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from consensus_api.backend import Target, TargetKind
from consensus_api.keys import parent_of

KV = "kv"
GROUPS = "groups"
ELECTIONS = "elections"
MIGRATION = "migration"

_ESCAPED = re.compile("%(25|2F)")


def escape(name: str) -> str:
    """``name`` as one etcd key segment: ``%`` and ``/`` percent-encoded."""
    return name.replace("%", "%25").replace("/", "%2F")


def unescape(segment: str) -> str:
    """The inverse of ``escape``."""
    return _ESCAPED.sub(lambda match: "%" if match[1] == "25" else "/", segment)


def prefix_end(prefix: bytes) -> bytes:
    """The exclusive end of the key range of every key starting with ``prefix``."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return b"\x00"
    return stripped[:-1] + bytes([stripped[-1] + 1])


@dataclass(frozen=True, slots=True)
class Layout:
    """The etcd keys of one backend prefix."""

    root: str

    @classmethod
    def from_path(cls, path: str) -> Layout:
        """The layout for a URL path such as ``/myapp`` (``""`` or ``/`` is the bare root)."""
        return cls(path.rstrip("/"))

    @property
    def everything(self) -> bytes:
        """The prefix of every key this backend writes."""
        return f"{self.root}/".encode()

    def key(self, key: str) -> bytes:
        """The etcd key of the stored key ``key``."""
        return f"{self.root}/{KV}/{key}".encode()

    def children(self, namespace: str) -> bytes:
        """The prefix of every stored key below ``namespace`` (``""`` is the root)."""
        return f"{self.root}/{KV}/{namespace}/".encode() if namespace else f"{self.root}/{KV}/".encode()

    def group(self, group: str) -> bytes:
        """The prefix of the members of ``group``."""
        return f"{self.root}/{GROUPS}/{escape(group)}/".encode()

    def member(self, group: str, member_id: str) -> bytes:
        """The etcd key of one member."""
        return self.group(group) + member_id.encode()

    def election(self, service: str) -> bytes:
        """The prefix of the candidates for ``service``."""
        return f"{self.root}/{ELECTIONS}/{escape(service)}/".encode()

    def candidate(self, service: str, candidate_id: str) -> bytes:
        """The etcd key of one candidate."""
        return self.election(service) + candidate_id.encode()

    @property
    def seal(self) -> bytes:
        """The key that exists while the store is sealed."""
        return f"{self.root}/{MIGRATION}/seal".encode()

    @property
    def sessions(self) -> bytes:
        """The prefix of the live sessions' keys."""
        return f"{self.root}/{MIGRATION}/sessions/".encode()

    def targets(self, etcd_key: bytes) -> tuple[Target, ...]:
        """Every watchable target whose state depends on ``etcd_key``."""
        everything = self.everything
        if not etcd_key.startswith(everything):
            return ()
        try:
            area, _, rest = etcd_key[len(everything) :].decode().partition("/")
        except UnicodeDecodeError:
            return ()
        if not rest:
            return ()
        if area == KV:
            return (Target(TargetKind.VALUE, rest), Target(TargetKind.KEYSET, parent_of(rest)))
        name, slash, _ = rest.rpartition("/")
        if not slash:
            return ()
        if area == GROUPS:
            return (Target(TargetKind.GROUP, unescape(name)),)
        if area == ELECTIONS:
            return (Target(TargetKind.ELECTION, unescape(name)),)
        return ()
