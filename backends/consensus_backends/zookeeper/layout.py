"""Where everything lives under the URL's chroot, and how names become znode names.

Layout below ``<root>`` (the URL path, created on first use)::

    kv/                               the directory of namespace ""
    kv/k:<a>                          marker: key "a" exists (empty, created and deleted with the key)
    kv/v:<a>                          anchor of key "a": its value, b"" while deleted (never deleted)
    kv/v:<a>/c-<seq>                  chunks of a value too large for one znode
    kv/d:<a>/...                      the directory of namespace "a"
    groups/<group>/members/<member>   ephemeral claim (member ids are unique); data = the payload
    groups/<group>/roster/<member>~<data>  ephemeral, created and deleted with the claim: the
                                      payload inline (base64url) or ``*`` (read it from the claim)
    groups/<group>/chunks/<m>-<seq>   ephemeral chunks of large member data
    elections/<service>/ids/<id>      ephemeral claim: candidate ids are unique
    elections/<service>/queue/<id>-<seq>  ephemeral sequential candidate; the lowest leads
    migration                         bookkeeping of a migration (``seal``); its data is unused
    migration/seal                    b"sealed" while the store is sealed, b"" otherwise (never deleted)
    migration/sessions/<session id>   ephemeral: one per live backend session, named by its id (hex)

Markers make ``keys()`` one ``get_children`` and a key-set watch one child
watch; the roster makes a group's membership (small payloads) one
``get_children``. Anchors are permanent so that their ``stat.version`` never
restarts: a compare-and-set on an anchor's version can therefore never hit a later
incarnation of the key (no ABA), and its ``mzxid`` (the key's version)
strictly increases across delete and re-create.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

from consensus_api.errors import ConfigurationError
from consensus_api.keys import SEPARATOR

MARKER, ANCHOR, DIRECTORY = "k:", "v:", "d:"
CHUNK_PREFIX = "c-"
SEQUENCE_DIGITS = 10


def _needs_escape(char: str) -> bool:
    """Characters ZooKeeper rejects in a path (or that would split it), and the escape itself."""
    code = ord(char)
    return char in "%/" or code < 0x20 or 0x7F <= code <= 0x9F or code >= 0xD800


#: Any character ``_needs_escape`` accepts (a name without one is its own encoding).
_ESCAPED = re.compile("[%/\x00-\x1f\x7f-\x9f\ud800-\U0010ffff]")


def encode_name(text: str) -> str:
    """``text`` as one znode name: ``%``, ``/`` and characters ZooKeeper rejects become ``%XX``."""
    if _ESCAPED.search(text) is None:
        return text  # the common case, without a call per character
    return "".join(
        "".join(f"%{byte:02X}" for byte in char.encode("utf-8", "surrogatepass"))
        if _needs_escape(char)
        else char
        for char in text
    )


def decode_name(name: str) -> str:
    """The inverse of ``encode_name``."""
    return unquote(name, errors="surrogatepass")


def sequence_of(name: str) -> int | None:
    """The sequence number ZooKeeper appended to ``name``, or None if it has none."""
    digits = name[-SEQUENCE_DIGITS:]
    return int(digits) if len(name) > SEQUENCE_DIGITS and digits.isdigit() else None


def chroot_of(path: str) -> str:
    """The root znode for the URL path: ``""`` for ``/`` or nothing, else ``/a/b`` (checked)."""
    stripped = path.strip(SEPARATOR)
    if not stripped:
        return ""
    for segment in stripped.split(SEPARATOR):
        if not segment or segment in (".", "..") or any(_needs_escape(char) for char in segment):
            raise ConfigurationError(
                f"the zookeeper:// URL path {path!r} is not a valid ZooKeeper path "
                "(segments must be non-empty and must not be '.' or '..' or hold control characters)"
            )
    return SEPARATOR + stripped


#: Directory znodes remembered per namespace (one serves all its keys); the memory is forgotten
#: whole when it holds this many.
DIRECTORY_MEMORY = 4096


class Layout:
    """The znode paths of one chroot."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.kv = f"{root}/kv"
        self.groups = f"{root}/groups"
        self.elections = f"{root}/elections"
        self.migration = f"{root}/migration"
        self.seal = f"{self.migration}/seal"
        self.sessions = f"{self.migration}/sessions"
        self._directories: dict[str, str] = {}

    @property
    def barrier_path(self) -> str:
        """A znode that always exists: the target of the linearizing no-op write."""
        return self.root or "/"

    def base_paths(self) -> list[str]:
        """Every permanent znode the backend needs, parents first."""
        parts = self.root.split(SEPARATOR)[1:]
        chroot = [SEPARATOR + SEPARATOR.join(parts[: index + 1]) for index in range(len(parts))]
        return [*chroot, self.kv, self.groups, self.elections, self.migration, self.seal, self.sessions]

    # Storage

    def directory(self, namespace: str) -> str:
        """The directory znode of ``namespace`` (``kv`` itself for the root namespace)."""
        found = self._directories.get(namespace)
        if found is None:
            segments = namespace.split(SEPARATOR) if namespace else []
            found = self.kv + "".join(f"/{DIRECTORY}{encode_name(segment)}" for segment in segments)
            if len(self._directories) >= DIRECTORY_MEMORY:
                self._directories.clear()
            self._directories[namespace] = found
        return found

    def directories(self, namespace: str) -> list[str]:
        """The directory znodes from the top down to ``namespace``'s (without ``kv``)."""
        segments = namespace.split(SEPARATOR) if namespace else []
        return [self.directory(SEPARATOR.join(segments[: index + 1])) for index in range(len(segments))]

    def key_paths(self, key: str) -> tuple[str, str]:
        """``key``'s marker, the znode that exists exactly while ``key`` exists, and its anchor."""
        namespace, _, name = key.rpartition(SEPARATOR)
        directory, name = self.directory(namespace), encode_name(name)
        return f"{directory}/{MARKER}{name}", f"{directory}/{ANCHOR}{name}"

    def anchor(self, key: str) -> str:
        """The permanent znode holding ``key``'s value."""
        namespace, _, name = key.rpartition(SEPARATOR)
        return f"{self.directory(namespace)}/{ANCHOR}{encode_name(name)}"

    # Group membership

    def group(self, group: str) -> str:
        """The znode of ``group``."""
        return f"{self.groups}/{encode_name(group)}"

    def members(self, group: str) -> str:
        """The parent of ``group``'s member znodes."""
        return f"{self.group(group)}/members"

    def member(self, group: str, member_id: str) -> str:
        """The ephemeral znode of one member."""
        return f"{self.members(group)}/{encode_name(member_id)}"

    def roster(self, group: str) -> str:
        """The parent of ``group``'s roster entries (the znode a group watch watches)."""
        return f"{self.group(group)}/roster"

    def member_chunks(self, group: str) -> str:
        """The parent of the chunks of ``group``'s large member data."""
        return f"{self.group(group)}/chunks"

    # Leader election

    def election(self, service: str) -> str:
        """The znode of ``service``'s election."""
        return f"{self.elections}/{encode_name(service)}"

    def queue(self, service: str) -> str:
        """The parent of the candidates' sequential znodes."""
        return f"{self.election(service)}/queue"

    def claim(self, service: str, candidate_id: str) -> str:
        """The ephemeral znode that makes ``candidate_id`` unique among live candidates."""
        return f"{self.election(service)}/ids/{encode_name(candidate_id)}"

    def candidate_prefix(self, service: str, candidate_id: str) -> str:
        """The path ZooKeeper appends a sequence number to for a new candidate."""
        return f"{self.queue(service)}/{encode_name(candidate_id)}-"


def candidate_id_of(name: str) -> str | None:
    """The candidate id in a queue znode name ``<id>-<seq>``, or None for a foreign name."""
    if sequence_of(name) is None or name[-SEQUENCE_DIGITS - 1] != "-":
        return None
    return decode_name(name[: -SEQUENCE_DIGITS - 1])
