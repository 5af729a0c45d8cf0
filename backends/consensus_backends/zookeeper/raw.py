"""Any ZooKeeper tree read as keys: the source of ``consensus migrate --raw``.

Mapping: below the URL's chroot (``zookeeper://h:2181/legacy`` reads
``/legacy``), the znode ``/legacy/a/b`` is the path ``a/b``. A znode is a key
when it is persistent and holds data, or has no children (a leaf, even an
empty one); an intermediate znode without data is only structure. Ephemeral
znodes (sessions' state) and ZooKeeper's own ``/zookeeper`` subtree are never
read as keys. Paths are reported as they are: the migration reports those
that break the key rules (segments over 255 characters, keys over 1024
bytes) as keys the target cannot hold.

Reads: the first request of a walk and every ``fetch`` go behind a no-op
quorum write, so they see every write completed before they started. A
follow sets data and child watches on every znode below the prefix (re-set
after each event, and all again after a reconnect) and reports each znode's
state after re-reading it, on one thread, so the reports of a path come in
the order of its changes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError
from kazoo.protocol.states import WatchedEvent

from consensus_api import config
from consensus_api.errors import ConsensusError
from consensus_api.migrate.source import Changed
from consensus_api.model import SessionState
from consensus_backends.zookeeper.layout import chroot_of
from consensus_backends.zookeeper.lease import Connection
from consensus_backends.zookeeper.security import OPTIONS, Security

log = logging.getLogger("consensus_api.zookeeper")

#: Znodes per pipelined page of requests.
PAGE = 256

#: ZooKeeper's own subtree below the root.
SYSTEM = "zookeeper"


def open_source(url: str, options: Mapping[str, Any]) -> RawTree:
    """Connect to the tree ``url`` names; ``BackendUnavailableError`` after ``connect_timeout``."""
    parsed, query = config.parse_url(url)
    settings = config.build_options({**query, **options}, OPTIONS, parsed.scheme, parsed)
    tree = RawTree(parsed, settings)
    tree.open()
    return tree


class RawTree:
    """The znodes below one chroot as paths and values (a ``consensus_api.migrate.source.Source``)."""

    def __init__(self, url: config.BackendURL, settings: config.Options) -> None:
        self._root = chroot_of(url.path)
        self.request_timeout = settings.request_timeout
        self.connect_timeout = settings.connect_timeout
        self._follows: list[RawFollow] = []
        self._lock = threading.Lock()
        self.connection = Connection(url, settings, Security(settings.security), self._on_state, self._resync)

    def open(self) -> None:
        """Connect within ``connect_timeout``."""
        self.connection.open(time.monotonic() + self.connect_timeout)

    def close(self) -> None:
        """Stop every follow and disconnect."""
        with self._lock:
            follows, self._follows = self._follows, []
        for follow in follows:
            follow.close()
        self.connection.close()

    def znode(self, path: str) -> str:
        """The absolute znode path of ``path``."""
        return f"{self._root}/{path}" if path else self._root or "/"

    def path_of(self, znode: str) -> str:
        """The path of the absolute ``znode``."""
        return znode[len(self._root) :].lstrip("/")

    def is_key(self, path: str, data: bytes | None, stat: Any) -> bool:
        """Whether the znode at ``path`` is read as a key (see the module docstring)."""
        if not path or self.is_system(path) or stat.ephemeralOwner:
            return False
        return bool(data) or stat.numChildren == 0

    def is_system(self, path: str) -> bool:
        """Whether ``path`` is ZooKeeper's own subtree (only below the root ``/``)."""
        return not self._root and (path == SYSTEM or path.startswith(SYSTEM + "/"))

    def read(self, paths: list[str], *, barrier: bool, watch: Any = None, children: bool = True) -> list[Any]:
        """``[(data, stat, children) | None]`` for ``paths`` (None: no such znode), pipelined.

        With ``children=False`` only znodes whose stat counts children are listed
        (a second round trip); the others get ``[]``.
        """
        deadline = time.monotonic() + self.request_timeout
        found = self._batch("get_async", paths, deadline, barrier=barrier, watch=watch)
        if children:
            listed = self._batch("get_children_async", paths, deadline, barrier=False, watch=watch)
        else:
            parents = [path for path, item in zip(paths, found, strict=True) if item and item[1].numChildren]
            by_parent = dict(zip(parents, self._batch("get_children_async", parents, deadline), strict=True))
            listed = [
                by_parent.get(path, []) if item else None for path, item in zip(paths, found, strict=True)
            ]
        return [
            None if item is None or names is None else (item[0] or b"", item[1], list(names))
            for item, names in zip(found, listed, strict=True)
        ]

    def _batch(
        self, method: str, paths: list[str], deadline: float, *, barrier: bool = False, watch: Any = None
    ) -> list[Any]:
        """``client.<method>(znode, watch)`` for every path, pipelined; None for a missing znode."""
        if not paths:
            return []

        def build(client: KazooClient) -> list[Any]:
            call = getattr(client, method)
            return [call(self.znode(path), watch=watch) for path in paths]

        results = self.connection.read(build, deadline, barrier=self.znode("") if barrier else None)
        for result in results:
            if isinstance(result, Exception) and not isinstance(result, NoNodeError):
                raise ConsensusError(
                    f"ZooKeeper refused a read below {self._root or '/'}: {type(result).__name__}"
                )
        return [None if isinstance(result, NoNodeError) else result for result in results]

    def walk(self, prefix: str) -> Iterator[tuple[str, bytes]]:
        """Breadth first, in pages of ``PAGE`` znodes; every path once."""
        pending = deque([prefix])
        barrier = True
        while pending:
            batch = [pending.popleft() for _ in range(min(PAGE, len(pending)))]
            nodes = self.read(batch, barrier=barrier, children=False)
            barrier = False
            for path, node in zip(batch, nodes, strict=True):
                if node is None or self.is_system(path):
                    continue
                data, stat, children = node
                if self.is_key(path, data, stat):
                    yield path, data
                pending.extend(f"{path}/{child}" if path else child for child in sorted(children))

    def fetch(self, path: str) -> bytes | None:
        """The value of ``path`` if it is a key now."""
        [node] = self.read([path], barrier=True, children=False)
        if node is None or not self.is_key(path, node[0], node[1]):
            return None
        return bytes(node[0])

    def follow(self, prefix: str, changed: Changed) -> RawFollow:
        """Watch every znode below ``prefix``; see the module docstring."""
        follow = RawFollow(self, prefix, changed)
        with self._lock:
            self._follows.append(follow)
        follow.start()
        return follow

    def _on_state(self, state: SessionState) -> None:
        log.debug("raw ZooKeeper source: %s", state.name)

    def _resync(self) -> None:
        """Connected (perhaps on a new session, which has no watches): read every followed znode again."""
        with self._lock:
            follows = list(self._follows)
        for follow in follows:
            follow.resync()


class RawFollow:
    """Data and child watches on every znode below a prefix, re-read on one thread after each event."""

    def __init__(self, tree: RawTree, prefix: str, changed: Changed) -> None:
        self._tree = tree
        self._prefix = prefix
        self._changed = changed
        self._cond = threading.Condition()
        self._queue: dict[str, None] = {}
        self._known: set[str] = set()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="consensus-migrate-zkwatch", daemon=True)

    def start(self) -> None:
        """Read (and watch) the whole subtree, then follow it."""
        self._enqueue([self._prefix])
        self._thread.start()

    def add(self, paths: Iterable[str]) -> None:
        """Nothing to do: child watches find every new znode."""

    def resync(self) -> None:
        """Read every known znode (and the prefix) again, re-setting their watches."""
        with self._cond:
            known = list(self._known)
        self._enqueue([self._prefix, *known])

    def close(self) -> None:
        """Stop the thread (the watches fire once more, unheard)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(self._tree.request_timeout)

    def _enqueue(self, paths: list[str]) -> None:
        with self._cond:
            for path in paths:
                self._queue[path] = None
            self._cond.notify()

    def _on_watch(self, event: WatchedEvent) -> None:
        """kazoo's event thread: never block; just queue the znode for a re-read."""
        if event.path:
            self._enqueue([self._tree.path_of(event.path)])

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._closed or bool(self._queue))
                if self._closed:
                    return
                batch = list(self._queue)[:PAGE]
                for path in batch:
                    del self._queue[path]
            try:
                nodes = self._tree.read(batch, barrier=False, watch=self._on_watch)
            except ConsensusError as exc:
                log.info("re-reading %d watched znodes failed (%s); retrying", len(batch), exc)
                self._enqueue(batch)
                time.sleep(0.5)
                continue
            for path, node in zip(batch, nodes, strict=True):
                self._settle(path, node)

    def _settle(self, path: str, node: Any) -> None:
        if self._tree.is_system(path):
            return
        if node is None:
            if path == self._prefix:  # watch for the prefix to appear (a missing znode has no data watch)
                self._tree.connection.client.exists_async(self._tree.znode(path), watch=self._on_watch)
            with self._cond:
                gone = [known for known in self._known if known == path or known.startswith(path + "/")]
                self._known.difference_update(gone)
            for known in sorted(gone):
                self._changed(known, None)
            return
        data, stat, children = node
        below = [f"{path}/{child}" if path else child for child in children]
        with self._cond:
            self._known.add(path)
            new = [child for child in below if child not in self._known]
        self._changed(path, bytes(data) if self._tree.is_key(path, data, stat) else None)
        self._enqueue(new)
