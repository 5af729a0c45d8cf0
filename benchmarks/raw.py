"""Raw-client baselines: the same requests our backends send, made directly with the client library.

Each class sends, per operation, what the backend sends on the wire (read in
``backends/``), without our layers (argument checks, the session, deadlines,
error mapping, retries):

* ZooKeeper (kazoo): fetch and keys = a no-op ``check`` multi (the
  linearizing barrier) pipelined with ``get`` / ``get_children``; put = one
  multi creating marker and anchor and setting the anchor; update with a
  version = ``exists`` of the anchor, then a multi setting it at that stat
  version; fenced update = ``get_children`` of the election queue, then a
  multi checking the leader's znode and the marker and setting the anchor.
* etcd (pyetcd): fetch = a linearizable range; put / update / fenced update =
  one ``Txn`` with the same compares; keys = a keys-only prefix range; every
  call with the ``hasleader`` metadata (etcd's ``WithRequireLeader``).

SQL, Kafka and Redis live in ``benchmarks.raw_sql``, ``benchmarks.raw_kafka`` and
``benchmarks.raw_redis``.
"""

from __future__ import annotations

from typing import Any, Protocol

import pyetcd
from kazoo.client import KazooClient
from pyetcd import etcdrpc

from benchmarks.raw_kafka import RawKafka
from benchmarks.raw_redis import RawRedis
from benchmarks.raw_sql import RawSQL
from consensus_api import config


class RawOps(Protocol):
    """The five measured operations, through a raw client."""

    name: str

    def prepare(self, namespace: str) -> None:
        """Create what a write into ``namespace`` needs (as the backend does on first use)."""

    def fetch(self, key: str) -> object:
        """Read ``key``'s value and version."""

    def put(self, key: str, value: bytes) -> int:
        """Create ``key``; returns its version."""

    def update(self, key: str, value: bytes, version: int) -> int:
        """Replace ``key``'s value if at ``version``; returns the new version."""

    def fenced_update(self, key: str, value: bytes) -> int:
        """Replace ``key``'s value if this client still leads; returns the new version."""

    def keys(self, namespace: str) -> frozenset[str]:
        """The keys one level below ``namespace``."""

    def close(self) -> None:
        """Disconnect."""


def open_raw(url: str, run: str) -> RawOps:
    """A raw client for the backend ``url`` names, on its own paths (tables, topic) named after ``run``."""
    parsed, _ = config.parse_url(url)
    scheme = parsed.scheme
    if scheme in ("zookeeper", "zk"):
        return RawZooKeeper(parsed, run)
    if scheme == "etcd":
        return RawEtcd(parsed, run)
    if scheme == "kafka":
        return RawKafka(parsed, run)
    if scheme == "redis":
        return RawRedis(parsed, run)
    return RawSQL(parsed, run)


def zk_hosts(url: config.BackendURL) -> str:
    """kazoo's host string for ``url``."""
    return ",".join(f"{e.host}:{e.port or 2181}" for e in url.endpoints)


class RawZooKeeper:
    """kazoo, with the znode layout of ``consensus_backends.zookeeper.layout`` (marker, anchor, dirs)."""

    name = "kazoo"

    def __init__(self, url: config.BackendURL, run: str) -> None:
        self.root = f"{url.path.rstrip('/')}/rawbench-{run}"
        self.client = KazooClient(hosts=zk_hosts(url), timeout=10)
        self.client.start(timeout=10)
        self.client.ensure_path(f"{self.root}/kv")
        self.client.ensure_path(f"{self.root}/queue")
        self._leader = self.client.create(f"{self.root}/queue/me-", ephemeral=True, sequence=True)

    def _directory(self, namespace: str) -> str:
        return f"{self.root}/kv" + "".join(f"/d:{segment}" for segment in namespace.split("/") if segment)

    def _paths(self, key: str) -> tuple[str, str]:
        namespace, _, name = key.rpartition("/")
        directory = self._directory(namespace)
        return f"{directory}/k:{name}", f"{directory}/v:{name}"

    def prepare(self, namespace: str) -> None:
        """Create the directory znodes of ``namespace`` (ours creates them on first use too)."""
        self.client.ensure_path(self._directory(namespace))

    def fetch(self, key: str) -> object:
        _, anchor = self._paths(key)
        barrier = self.client.transaction()
        barrier.check(self.root, -1)
        done = barrier.commit_async()
        found = self.client.get_async(anchor)
        done.get(timeout=10)
        data, stat = found.get(timeout=10)
        return bytes(data[1:]), stat.mzxid

    def put(self, key: str, value: bytes) -> int:
        marker, anchor = self._paths(key)
        txn = self.client.transaction()
        txn.create(marker, b"")
        txn.create(anchor, b"")
        txn.set_data(anchor, b"\x00" + value)
        results = txn.commit()
        return int(results[-1].mzxid)

    def update(self, key: str, value: bytes, version: int) -> int:
        _, anchor = self._paths(key)
        stat = self.client.exists(anchor)
        if stat.mzxid != version:
            raise RuntimeError("version conflict")
        txn = self.client.transaction()
        txn.set_data(anchor, b"\x00" + value, stat.version)
        return int(txn.commit()[-1].mzxid)

    def fenced_update(self, key: str, value: bytes) -> int:
        marker, anchor = self._paths(key)
        queue = f"{self.root}/queue"
        lowest = min(self.client.get_children(queue), key=lambda name: int(name[-10:]))
        txn = self.client.transaction()
        txn.check(f"{queue}/{lowest}", 0)
        txn.check(marker, -1)
        txn.set_data(anchor, b"\x00" + value)
        return int(txn.commit()[-1].mzxid)

    def keys(self, namespace: str) -> frozenset[str]:
        barrier = self.client.transaction()
        barrier.check(self.root, -1)
        done = barrier.commit_async()
        listed = self.client.get_children_async(self._directory(namespace))
        done.get(timeout=10)
        return frozenset(f"{namespace}/{n[2:]}" for n in listed.get(timeout=10) if n.startswith("k:"))

    def close(self) -> None:
        self.client.stop()
        self.client.close()


def etcd_endpoint(url: config.BackendURL) -> tuple[str, int]:
    """The first endpoint of an etcd URL."""
    first = url.endpoints[0]
    return first.host, first.port or 2379


class RawEtcd:
    """pyetcd (``MultiEndpointEtcd3Client``), keys under ``/rawbench-<run>/``, one lease for the fence."""

    name = "pyetcd"

    def __init__(self, url: config.BackendURL, run: str) -> None:
        #: What the backend sends with every call (etcd's WithRequireLeader), sent here too.
        self.metadata = (("hasleader", "true"),)
        host, port = etcd_endpoint(url)
        self.client = pyetcd.MultiEndpointEtcd3Client(
            endpoints=[pyetcd.Endpoint(host, port, secure=False, time_retry=0.5)], timeout=10
        )
        self.prefix = f"/rawbench-{run}"
        self.lease = self.client.lease(60)
        self.candidate = f"{self.prefix}/elections/me".encode()
        self.client.put(self.candidate, b"", lease=self.lease)
        _, meta = self.client.get(self.candidate)
        self.term = int(meta.create_revision)

    def _key(self, key: str) -> bytes:
        return f"{self.prefix}/kv/{key}".encode()

    def prepare(self, namespace: str) -> None:
        """Nothing to create in etcd's flat key space."""

    def _compare(self, key: bytes, target: str, result: str, **value: int) -> Any:
        compare = etcdrpc.Compare
        return compare(key=key, target=getattr(compare, target), result=getattr(compare, result), **value)

    def _put(self, key: bytes, value: bytes) -> Any:
        return etcdrpc.RequestOp(request_put=etcdrpc.PutRequest(key=key, value=value))

    def _txn(self, compare: list[Any], success: list[Any], failure: list[Any]) -> Any:
        request = etcdrpc.TxnRequest(compare=compare, success=success, failure=failure)
        response = self.client.kvstub.Txn(request, self.client.timeout, metadata=self.metadata)
        if not response.succeeded:
            raise RuntimeError("transaction failed")
        return response

    def fetch(self, key: str) -> object:
        response = self.client.kvstub.Range(
            etcdrpc.RangeRequest(key=self._key(key)), self.client.timeout, metadata=self.metadata
        )
        kv = response.kvs[0]
        return bytes(kv.value), int(kv.mod_revision)

    def put(self, key: str, value: bytes) -> int:
        target = self._key(key)
        compare = [self._compare(target, "CREATE", "EQUAL", create_revision=0)]
        return int(self._txn(compare, [self._put(target, value)], []).header.revision)

    def update(self, key: str, value: bytes, version: int) -> int:
        target = self._key(key)
        compare = [
            self._compare(target, "CREATE", "GREATER", create_revision=0),
            self._compare(target, "MOD", "EQUAL", mod_revision=version),
        ]
        meta = etcdrpc.RequestOp(request_range=etcdrpc.RangeRequest(key=target, keys_only=True))
        return int(self._txn(compare, [self._put(target, value)], [meta]).header.revision)

    def fenced_update(self, key: str, value: bytes) -> int:
        target = self._key(key)
        candidates = f"{self.prefix}/elections/".encode()
        end = candidates[:-1] + bytes([candidates[-1] + 1])
        compare = [
            self._compare(target, "CREATE", "GREATER", create_revision=0),
            self._compare(self.candidate, "CREATE", "EQUAL", create_revision=self.term),
            etcdrpc.Compare(
                key=candidates,
                range_end=end,
                target=etcdrpc.Compare.CREATE,
                result=etcdrpc.Compare.GREATER,
                create_revision=self.term - 1,
            ),
        ]
        oldest = etcdrpc.RangeRequest(
            key=candidates,
            range_end=end,
            limit=1,
            keys_only=True,
            sort_order=etcdrpc.RangeRequest.ASCEND,
            sort_target=etcdrpc.RangeRequest.CREATE,
        )
        failure = [
            etcdrpc.RequestOp(request_range=etcdrpc.RangeRequest(key=target, keys_only=True)),
            etcdrpc.RequestOp(request_range=oldest),
        ]
        return int(self._txn(compare, [self._put(target, value)], failure).header.revision)

    def keys(self, namespace: str) -> frozenset[str]:
        prefix = self._key(namespace) + b"/"
        end = prefix[:-1] + bytes([prefix[-1] + 1])
        request = etcdrpc.RangeRequest(key=prefix, range_end=end, keys_only=True, limit=1000)
        response = self.client.kvstub.Range(request, self.client.timeout, metadata=self.metadata)
        children = set()
        for kv in response.kvs:
            child, slash, _ = kv.key[len(prefix) :].partition(b"/")
            if not slash:
                children.add(f"{namespace}/{child.decode()}")
        return frozenset(children)

    def close(self) -> None:
        self.lease.revoke()
        self.client.close()
