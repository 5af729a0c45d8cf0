"""The Kafka baseline: a command log on a one-partition topic, with kafka-python only.

The same work as ``consensus_backends.kafka.commandlog``: an idempotent ``acks=all``
producer appends one record per write (headers carry the operation, the
expected version, the fence and the writer's request id); one consumer thread
tails the partition from offset 0 and applies each record, in offset order, to
a dict; a writer learns its outcome when the tail applies its record. A read
asks for the end offset (ListOffsets, through ``KafkaAdminClient``) and waits
until the tail has passed it. Own topic ``rawbench-<run>.kv``.
"""

from __future__ import annotations

import itertools
import threading
import uuid
from collections import defaultdict
from typing import Any

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition

from consensus_api import config

TIMEOUT = 10.0


class RawKafka:
    """kafka-python producer, consumer and admin client."""

    name = "kafka-python"

    def __init__(self, url: config.BackendURL, run: str) -> None:
        servers = ",".join(f"{e.host}:{e.port or 9092}" for e in url.endpoints)
        self.topic = f"rawbench-{run}.kv"
        self.partition = TopicPartition(self.topic, 0)
        self.admin = KafkaAdminClient(bootstrap_servers=servers, request_timeout_ms=10_000)
        self.admin.create_topics(
            {self.topic: {"num_partitions": 1, "replication_factor": 1}}, wait_for_metadata=True
        )
        self.producer = KafkaProducer(
            bootstrap_servers=servers, acks=-1, enable_idempotence=True, linger_ms=0, max_block_ms=10_000
        )
        self.consumer = KafkaConsumer(
            bootstrap_servers=servers,
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=500,
        )
        self.servers = servers
        self.pool: list[Any] = []
        self.pool_lock = threading.Lock()
        self.consumer.assign([self.partition])
        self.consumer.seek(self.partition, 0)
        self.session = uuid.uuid4().hex
        self.requests = itertools.count(1)
        self.values: dict[str, tuple[bytes, int]] = {}
        self.children: defaultdict[str, set[str]] = defaultdict(set)
        self.outcomes: dict[int, int | None] = {}
        self.applied = threading.Condition()
        self.next_offset = 0
        self.term = 1
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._tail, name="rawbench-kafka-tail", daemon=True)
        self.thread.start()

    def _tail(self) -> None:
        while not self.stopping.is_set():
            batches = self.consumer.poll(timeout_ms=200)
            records = batches.get(self.partition, [])
            with self.applied:
                for record in records:
                    self._apply(record.offset, dict(record.headers or []), record.value or b"")
                if records:
                    self.next_offset = records[-1].offset + 1
                    self.applied.notify_all()

    def _apply(self, offset: int, headers: dict[str, bytes], value: bytes) -> None:
        key = headers["k"].decode()
        current = self.values.get(key)
        op = headers["op"]
        fence_ok = "ft" not in headers or int(headers["ft"]) == self.term
        ok = fence_ok and (
            (op == b"put" and current is None)
            or (
                op == b"update"
                and current is not None
                and ("ver" not in headers or int(headers["ver"]) == current[1])
            )
        )
        if ok:
            self.values[key] = (value, offset + 1)
            self.children[key.rpartition("/")[0]].add(key)
        if headers["sid"].decode() == self.session:
            self.outcomes[int(headers["rid"])] = offset + 1 if ok else None

    def _command(self, headers: list[tuple[str, bytes]], value: bytes) -> int:
        request = next(self.requests)
        headers = [*headers, ("sid", self.session.encode()), ("rid", str(request).encode())]
        self.producer.send(self.topic, value=value, headers=headers, partition=0).get(timeout=TIMEOUT)
        with self.applied:
            if not self.applied.wait_for(lambda: request in self.outcomes, TIMEOUT):
                raise TimeoutError("the tail did not apply the record")
            outcome = self.outcomes.pop(request)
        if outcome is None:
            raise RuntimeError("the command was rejected")
        return outcome

    def _end_offset(self) -> int:
        with self.pool_lock:
            consumer = self.pool.pop() if self.pool else None
        if consumer is None:
            consumer = KafkaConsumer(bootstrap_servers=self.servers, group_id=None, enable_auto_commit=False)
        try:
            return int(consumer.end_offsets([self.partition], timeout_ms=int(TIMEOUT * 1000))[self.partition])
        finally:
            with self.pool_lock:
                self.pool.append(consumer)

    def _sync(self) -> None:
        end = self._end_offset()
        with self.applied:
            if not self.applied.wait_for(lambda: self.next_offset >= end, TIMEOUT):
                raise TimeoutError("the tail did not catch up")

    def prepare(self, namespace: str) -> None:
        """Nothing to create: keys are rows (records)."""

    def fetch(self, key: str) -> object:
        self._sync()
        with self.applied:
            return self.values.get(key)

    def put(self, key: str, value: bytes) -> int:
        return self._command([("ca", b"1"), ("op", b"put"), ("k", key.encode())], value)

    def update(self, key: str, value: bytes, version: int) -> int:
        headers = [("ca", b"1"), ("op", b"update"), ("k", key.encode()), ("ver", str(version).encode())]
        return self._command(headers, value)

    def fenced_update(self, key: str, value: bytes) -> int:
        fence = [("fs", b"fence"), ("fl", b"me"), ("ft", str(self.term).encode())]
        return self._command([("ca", b"1"), ("op", b"update"), ("k", key.encode()), *fence], value)

    def keys(self, namespace: str) -> frozenset[str]:
        self._sync()
        with self.applied:
            return frozenset(self.children.get(namespace, ()))

    def close(self) -> None:
        self.stopping.set()
        self.thread.join(2 * TIMEOUT)
        self.consumer.close()
        for consumer in self.pool:
            consumer.close()
        self.producer.close(timeout=5)
        try:
            self.admin.delete_topics([self.topic])
        finally:
            self.admin.close()
