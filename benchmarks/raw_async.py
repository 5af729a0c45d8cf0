"""The raw clients' own asyncio reads against their blocking reads: what any ``await`` costs.

An ``aio`` row compares our awaited call with our blocking call. Where the raw
client has an asyncio API of its own, the same read is timed both ways through
that client alone, interleaved in the same run, so the ``aio`` rows can be read
against the least an asyncio call of that client costs on this machine:

* etcd: grpc's ``grpc.aio`` channel against a blocking call on a plain channel
  (one linearizable ``Range`` of one key each).
* ZooKeeper: kazoo's ``get_async``, its completion handed to the loop with
  ``call_soon_threadsafe``, against ``get``.
* PostgreSQL: psycopg's ``AsyncConnection`` against ``Connection`` (one
  ``SELECT`` of a one-row table each, autocommit).
* Redis: ``redis.asyncio`` against ``redis.Redis`` (one ``HMGET`` of a hash's
  two fields each, as the backend's fetch), each on a pool of at most 16
  connections, as the backend's asyncio storage keeps (``consensus_redis.aio``).

SQLite needs no asyncio client (ours reads on the loop), and kafka-python has
none: ``open_raw_async`` returns None for them.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

import grpc
import psycopg
import redis
import redis.asyncio
from kazoo.client import KazooClient
from pyetcd import etcdrpc

from benchmarks.raw import etcd_endpoint, zk_hosts
from benchmarks.raw_sql import postgresql_url
from consensus_api import config

VALUE = b"v" * 100


class RawAsyncRead(Protocol):
    """One read through a raw client, blocking and awaited; opened and closed on the running loop."""

    name: str

    def read(self) -> object:
        """The blocking read."""

    async def read_async(self) -> object:
        """The same read through the client's asyncio API."""

    async def close(self) -> None:
        """Disconnect both ways."""


async def open_raw_async(url: str, run: str) -> RawAsyncRead | None:
    """The raw asyncio read for the backend ``url`` names, or None where its client has no asyncio API."""
    parsed, _ = config.parse_url(url)
    if parsed.scheme == "etcd":
        return await _Etcd.open(parsed, run)
    if parsed.scheme in ("zookeeper", "zk"):
        return await _ZooKeeper.open(parsed, run)
    if parsed.scheme.startswith("postgres"):
        return await _PostgreSQL.open(parsed, run)
    if parsed.scheme == "redis":
        return _Redis(parsed, run)
    return None


class _Etcd:
    name = "grpc.aio"

    def __init__(self, blocking: Any, awaited: Any, channels: tuple[Any, Any], key: bytes) -> None:
        self._request = etcdrpc.RangeRequest(key=key)
        self._blocking = blocking
        self._awaited = awaited
        self._channels = channels

    @classmethod
    async def open(cls, url: config.BackendURL, run: str) -> _Etcd:
        host, port = etcd_endpoint(url)
        target = f"{host}:{port}"
        plain, native = grpc.insecure_channel(target), grpc.aio.insecure_channel(target)
        key = f"/rawbench-{run}/async".encode()
        etcdrpc.KVStub(plain).Put(etcdrpc.PutRequest(key=key, value=VALUE), timeout=10)
        return cls(etcdrpc.KVStub(plain), etcdrpc.KVStub(native), (plain, native), key)

    def read(self) -> object:
        return self._blocking.Range(self._request, timeout=10)

    async def read_async(self) -> object:
        return await self._awaited.Range(self._request, timeout=10)

    async def close(self) -> None:
        plain, native = self._channels
        plain.close()
        await native.close()


class _ZooKeeper:
    name = "kazoo get_async"

    def __init__(self, client: Any, path: str) -> None:
        self._client = client
        self._path = path

    @classmethod
    async def open(cls, url: config.BackendURL, run: str) -> _ZooKeeper:
        client = KazooClient(hosts=zk_hosts(url), timeout=10)
        client.start(timeout=10)
        path = f"{url.path.rstrip('/')}/rawbench-{run}/async"
        client.create(path, VALUE, makepath=True)
        return cls(client, path)

    def read(self) -> object:
        return self._client.get(self._path)

    async def read_async(self) -> object:
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[object] = loop.create_future()

        def settle(result: Any) -> None:
            try:
                value = result.get_nowait()
            except Exception as exc:
                loop.call_soon_threadsafe(answer.set_exception, exc)
            else:
                loop.call_soon_threadsafe(answer.set_result, value)

        self._client.get_async(self._path).rawlink(settle)
        return await answer

    async def close(self) -> None:
        self._client.delete(self._path)
        self._client.stop()
        self._client.close()


class _PostgreSQL:
    name = "psycopg AsyncConnection"

    def __init__(self, blocking: Any, awaited: Any, table: str) -> None:
        self._blocking = blocking
        self._awaited = awaited
        self._query = f"SELECT v FROM {table} WHERE k = 1"
        self._table = table

    @classmethod
    async def open(cls, url: config.BackendURL, run: str) -> _PostgreSQL:
        conninfo = postgresql_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
        blocking = psycopg.connect(conninfo, autocommit=True)
        awaited = await psycopg.AsyncConnection.connect(conninfo, autocommit=True)
        table = "rawbench_async_" + "".join(c if c.isalnum() else "_" for c in run)
        blocking.execute(f"CREATE TABLE IF NOT EXISTS {table} (k int PRIMARY KEY, v bytea)")
        blocking.execute(f"INSERT INTO {table} VALUES (1, %s) ON CONFLICT DO NOTHING", (VALUE,))
        return cls(blocking, awaited, table)

    def read(self) -> object:
        return self._blocking.execute(self._query).fetchone()

    async def read_async(self) -> object:
        cursor = await self._awaited.execute(self._query)
        return await cursor.fetchone()

    async def close(self) -> None:
        self._blocking.execute(f"DROP TABLE IF EXISTS {self._table}")
        self._blocking.close()
        await self._awaited.close()


class _Redis:
    name = "redis.asyncio"

    def __init__(self, url: config.BackendURL, run: str) -> None:
        endpoint = url.endpoints[0]
        common: dict[str, Any] = {
            "host": endpoint.host,
            "port": endpoint.port or 6379,
            "username": url.username,
            "password": url.password,
            "socket_timeout": 10,
            "protocol": 2,
        }
        self._key = f"{url.path.rstrip('/')}/rawbench-{run}/async"
        pool = redis.BlockingConnectionPool(max_connections=16, **common)  # type: ignore[no-untyped-call]
        self._blocking = redis.Redis(connection_pool=pool)
        self._awaited = redis.asyncio.Redis(
            connection_pool=redis.asyncio.BlockingConnectionPool(max_connections=16, **common)
        )
        self._blocking.hset(self._key, mapping={"v": VALUE, "n": 1})

    def read(self) -> object:
        return self._blocking.hmget(self._key, "v", "n")

    async def read_async(self) -> object:
        return await self._awaited.hmget(self._key, "v", "n")

    async def close(self) -> None:
        self._blocking.delete(self._key)
        self._blocking.close()
        await self._awaited.aclose()
