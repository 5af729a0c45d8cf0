"""The Redis baseline: redis-py sending the backend's own Lua scripts (``consensus_redis.scripts``).

Per operation, what the backend sends: fetch = one ``HMGET``; put, update with
a version and fenced update = one ``EVALSHA`` of the same script (the fenced
one with this client's service, leader id and term); keys = one ``SMEMBERS``.
The fence comes from a session and a candidacy opened with the backend's
``OPEN`` and ``NOMINATE`` scripts. Without our layers: no argument checks,
no deadlines or error mapping, redis-py's ``register_script`` (EVALSHA, EVAL
on ``NOSCRIPT``), RESP2 as the backend speaks.
"""

from __future__ import annotations

import uuid
from typing import Any

import redis

from consensus_api import config
from consensus_redis import scripts
from consensus_redis.layout import Layout

SERVICE = "fence"
LEADER = "me"


class RawRedis:
    """redis-py on keys under ``<prefix>/rawbench-<run>``."""

    name = "redis-py"

    def __init__(self, url: config.BackendURL, run: str) -> None:
        endpoint = url.endpoints[0]
        self.client = redis.Redis(
            host=endpoint.host,
            port=endpoint.port or 6379,
            username=url.username,
            password=url.password,
            socket_timeout=10,
            protocol=2,
        )
        self.prefix = f"{url.path.rstrip('/')}/rawbench-{run}"
        self.layout = Layout(self.prefix)
        self.script: dict[str, Any] = {
            name: self.client.register_script(scripts.PRELUDE + getattr(scripts, name))
            for name in ("PUT", "UPDATE", "OPEN", "NOMINATE", "LEADERSHIP", "CLOSE")
        }
        self.session = uuid.uuid4().hex
        self.script["OPEN"](args=[self.prefix, self.session, 60_000, ""])
        self.script["NOMINATE"](args=[self.prefix, self.session, SERVICE, LEADER])
        self.term = int(self.script["LEADERSHIP"](args=[self.prefix, SERVICE])[2])

    def prepare(self, namespace: str) -> None:
        """Nothing to create: a key is a hash made by its first write."""

    def fetch(self, key: str) -> object:
        return self.client.hmget(self.layout.key("kv", key), "v", "n")

    def put(self, key: str, value: bytes) -> int:
        return int(self.script["PUT"](args=[self.prefix, "", "", "", key, value])[1])

    def update(self, key: str, value: bytes, version: int) -> int:
        return int(self.script["UPDATE"](args=[self.prefix, "", "", "", key, value, version])[1])

    def fenced_update(self, key: str, value: bytes) -> int:
        reply = self.script["UPDATE"](args=[self.prefix, SERVICE, LEADER, self.term, key, value, ""])
        if reply[0] != b"ok":
            raise RuntimeError(f"the fenced update was refused: {reply[0]!r}")
        return int(reply[1])

    def keys(self, namespace: str) -> frozenset[str]:
        members: Any = self.client.smembers(self.layout.key("ns", namespace))
        return frozenset(m.decode() for m in members)

    def close(self) -> None:
        self.script["CLOSE"](args=[self.prefix, self.session])
        self.client.close()
