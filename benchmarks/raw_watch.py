"""Raw-client change notification: one client writes a value, another one's own watch reports it.

* ZooKeeper: kazoo ``set`` → kazoo ``DataWatch`` (which re-reads the znode
  after each event, as a kazoo user gets it).
* etcd: pyetcd ``put`` → pyetcd ``add_watch_callback`` (the value comes in the event).
* PostgreSQL: an ``UPDATE`` and ``pg_notify`` in one transaction (SQLAlchemy
  Core) → a psycopg connection's ``LISTEN`` (the payload is the value).
* Redis: the backend's ``UPDATE`` script (it appends to the change stream)
  through redis-py → another client's ``XREAD BLOCK`` on the stream, then an
  ``HMGET`` of the value (as the backend re-reads).

SQLite and Kafka have no raw watch to compare with.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Protocol

import psycopg
import pyetcd
from kazoo.client import KazooClient
from pyetcd.watch import WatchResponse
from sqlalchemy import Column, LargeBinary, MetaData, String, Table, create_engine, func, select

from benchmarks.raw import etcd_endpoint, zk_hosts
from benchmarks.raw_redis import RawRedis
from benchmarks.raw_sql import postgresql_url
from consensus_api import config

Seen = Callable[[bytes], None]


class RawWatch(Protocol):
    """A writer and a watcher on one key."""

    name: str

    def write(self, value: bytes) -> None:
        """Write ``value`` with the writer client."""

    def close(self) -> None:
        """Stop watching and disconnect both clients."""


def open_raw_watch(url: str, run: str, seen: Seen) -> RawWatch | None:
    """The raw watch of the backend ``url`` names, calling ``seen(value)``; None for SQLite and Kafka."""
    parsed, _ = config.parse_url(url)
    if parsed.scheme in ("zookeeper", "zk"):
        return ZooKeeperWatch(parsed, run, seen)
    if parsed.scheme == "etcd":
        return EtcdWatch(parsed, run, seen)
    if parsed.scheme.startswith("postgresql"):
        return PostgresNotify(parsed, run, seen)
    if parsed.scheme == "redis":
        return RedisStream(parsed, run, seen)
    return None


class ZooKeeperWatch:
    """kazoo ``set`` and kazoo ``DataWatch``."""

    name = "kazoo DataWatch"

    def __init__(self, url: config.BackendURL, run: str, seen: Seen) -> None:
        self.path = f"{url.path.rstrip('/')}/rawbench-{run}/watched"
        self.writer = KazooClient(hosts=zk_hosts(url), timeout=10)
        self.watcher = KazooClient(hosts=zk_hosts(url), timeout=10)
        for client in (self.writer, self.watcher):
            client.start(timeout=10)
        self.writer.create(self.path, b"", makepath=True)

        def changed(data: bytes | None, stat: Any) -> None:
            if data:
                seen(bytes(data))

        self.watcher.DataWatch(self.path, changed)

    def write(self, value: bytes) -> None:
        self.writer.set(self.path, value)

    def close(self) -> None:
        for client in (self.writer, self.watcher):
            client.stop()
            client.close()


class EtcdWatch:
    """pyetcd ``put`` and ``add_watch_callback`` on two clients."""

    name = "etcd watch (pyetcd)"

    def __init__(self, url: config.BackendURL, run: str, seen: Seen) -> None:
        host, port = etcd_endpoint(url)
        self.key = f"/rawbench-{run}/watched".encode()
        self.writer, self.watcher = (
            pyetcd.MultiEndpointEtcd3Client(
                endpoints=[pyetcd.Endpoint(host, port, secure=False, time_retry=0.5)], timeout=10
            )
            for _ in range(2)
        )

        def changed(response: Any) -> None:
            if isinstance(response, WatchResponse):
                for event in response.events:
                    seen(bytes(event.value))

        self.watch_id = self.watcher.add_watch_callback(self.key, changed)

    def write(self, value: bytes) -> None:
        self.writer.put(self.key, value)

    def close(self) -> None:
        self.watcher.cancel_watch(self.watch_id)
        self.writer.close()
        self.watcher.close()


class PostgresNotify:
    """``UPDATE`` + ``pg_notify`` through SQLAlchemy Core, ``LISTEN`` on a psycopg connection."""

    name = "LISTEN/NOTIFY (psycopg)"

    def __init__(self, url: config.BackendURL, run: str, seen: Seen) -> None:
        self.engine = create_engine(postgresql_url(url))
        self.table = Table(
            f"rawbench_{run}_watch",
            MetaData(),
            Column("key", String(100), primary_key=True),
            Column("value", LargeBinary),
        )
        self.channel = self.table.name
        with self.engine.begin() as conn:
            self.table.create(conn)
            conn.execute(self.table.insert().values(key="watched", value=b""))
        args, kwargs = self.engine.dialect.create_connect_args(self.engine.url)
        self.listener = psycopg.connect(*args, **{**kwargs, "autocommit": True})
        self.listener.execute(f'LISTEN "{self.channel}"')
        self.stopping = threading.Event()

        def listen() -> None:
            while not self.stopping.is_set():
                for note in self.listener.notifies(timeout=0.25):
                    seen(note.payload.encode())

        self.thread = threading.Thread(target=listen, name="rawbench-listen", daemon=True)
        self.thread.start()

    def write(self, value: bytes) -> None:
        with self.engine.begin() as conn:
            conn.execute(self.table.update().where(self.table.c.key == "watched").values(value=value))
            conn.execute(select(func.pg_notify(self.channel, value.decode())))

    def close(self) -> None:
        self.stopping.set()
        self.thread.join(5)
        self.listener.close()
        with self.engine.begin() as conn:
            self.table.drop(conn)
        self.engine.dispose()


class RedisStream:
    """The backend's ``UPDATE`` script through redis-py, ``XREAD BLOCK`` and ``HMGET`` on another client."""

    name = "XREAD BLOCK (redis-py)"

    def __init__(self, url: config.BackendURL, run: str, seen: Seen) -> None:
        self.writer = RawRedis(url, run)
        self.reader = RawRedis(url, run)
        self.writer.put("watched", b"")
        stream = self.reader.layout.key("changes")
        self.stopping = threading.Event()

        client: Any = self.reader.client
        newest = client.xrevrange(stream, count=1)

        def listen() -> None:
            last = newest[0][0] if newest else b"0-0"
            while not self.stopping.is_set():
                for _, entries in client.xread({stream: last}, block=250) or ():
                    last = entries[-1][0]
                    value, _version = client.hmget(self.reader.layout.key("kv", "watched"), "v", "n")
                    if value:
                        seen(bytes(value))

        self.thread = threading.Thread(target=listen, name="rawbench-xread", daemon=True)
        self.thread.start()

    def write(self, value: bytes) -> None:
        self.writer.script["UPDATE"](args=[self.writer.prefix, "", "", "", "watched", value, ""])

    def close(self) -> None:
        self.stopping.set()
        self.thread.join(5)
        self.writer.close()
        self.reader.close()
