"""The replicated command log: one producer and one tailing reader per session.

Writers append commands with an idempotent ``acks=all`` producer. A reader
thread fetches the topic's single partition from offset 0 and applies every
command in offset order to the session's :class:`StateMachine`, so all
sessions agree which write won. A writer learns its outcome when its own
reader applies its command (the command carries the session id and a request
number). ``sync`` reads the end offset (ListOffsets, the high watermark) and
waits until the reader has applied everything below it: every write
acknowledged before ``sync`` started is then visible (linearizable reads).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import kafka.errors as kerrors
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.net.compat import KafkaNetClient

from consensus_api.backend import Target
from consensus_api.errors import OperationTimeoutError
from consensus_backends.kafka.client import Channel
from consensus_backends.kafka.errors import timeout_error, translate
from consensus_backends.kafka.records import Command, decode, encode
from consensus_backends.kafka.settings import MAX_RECORD_BYTES, Settings
from consensus_backends.kafka.state import Outcome, StateMachine

log = logging.getLogger("consensus_api.kafka")

#: The longest one ``KafkaConsumer.poll`` of the reader waits. A poll returns as soon as a fetch brings
#: records (the broker answers a fetch at once when the log grows, else after ``fetch_max_wait_ms``), so
#: this bounds nothing a reader waits for: the leader hint reaches the consumer from the channel's probe
#: (``Channel.follow_leader``) and ``close`` ends a poll by closing the consumer. Each poll arms
#: kafka-python's timers on its IO thread: short polls cost CPU at rest.
POLL_MS = 5000
#: The reader's pause after a poll failed.
RETRY_S = 0.2


def _close_quietly(producer: Any) -> None:
    try:
        producer.close(timeout=0)
    except Exception:
        log.debug("closing a replaced Kafka producer failed", exc_info=True)


class _Slot:
    """Where the reader thread hands a writer its command's outcome."""

    def __init__(self) -> None:
        self._done = threading.Event()
        self.outcome: Outcome | None = None
        self.error: BaseException | None = None

    def settle(self, outcome: Outcome) -> None:
        self.outcome = outcome
        self._done.set()

    def fail(self, error: BaseException) -> None:
        self.error = error
        self._done.set()

    def wait(self, deadline: float) -> Outcome:
        if not self._done.wait(max(0.0, deadline - time.monotonic())):
            raise timeout_error("the outcome of a write")
        if self.outcome is not None:
            return self.outcome
        raise translate(self.error or RuntimeError("no outcome"), "the write")


class CommandLog:
    """Appends commands and applies the whole log, in order, to a state machine."""

    def __init__(
        self,
        settings: Settings,
        channel: Channel,
        state: StateMachine,
        on_change: Callable[[list[Target], frozenset[str]], None],
    ) -> None:
        """``on_change(targets, departed_in)`` follows each applied command that changed
        ``targets`` or recorded departures in the Kafka groups ``departed_in``."""
        self._settings = settings
        self._channel = channel
        self._state = state
        self._on_change = on_change
        self._partition = TopicPartition(settings.layout.topic, 0)
        self._session_id = uuid.uuid4().hex
        self._requests = itertools.count(1)
        self._slots: dict[int, _Slot] = {}
        self._applied = threading.Condition()
        self._next_offset = 0
        self._stopping = threading.Event()
        self._producer: Any = None
        self._producer_lock = threading.Lock()
        self._suspected = False
        self._consumer: Any = None
        self._thread: threading.Thread | None = None

    def open(self, deadline: float) -> None:
        """Create the producer and the reader, and start the reader thread."""
        request_ms = int(self._settings.request_timeout * 1000)
        wait_ms = max(10, min(500, request_ms // 2))
        created: list[KafkaNetClient] = []

        def client(**config: Any) -> KafkaNetClient:
            created.append(KafkaNetClient(**config))
            return created[-1]

        left = max(1, int((deadline - time.monotonic()) * 1000))
        try:
            self._producer = self._new_producer(deadline, client)
            self._consumer = KafkaConsumer(
                **self._settings.client(
                    kafka_client=client,
                    group_id=None,
                    enable_auto_commit=False,
                    auto_offset_reset="earliest",
                    fetch_max_wait_ms=wait_ms,
                    request_timeout_ms=max(request_ms, 2 * wait_ms + 1000),
                    max_partition_fetch_bytes=MAX_RECORD_BYTES,
                    bootstrap_timeout_ms=left,
                )
            )
        except BaseException:
            if self._producer is not None:
                self._producer.close(timeout=0)
            for opened in created:
                opened.close()
            self._producer = None
            raise
        self._consumer.assign([self._partition])
        self._consumer.seek(self._partition, 0)
        self._channel.follow_leader(self._follow_leader)
        self._thread = threading.Thread(target=self._tail, name="consensus-kafka-reader", daemon=True)
        self._thread.start()

    def close(self, timeout: float) -> None:
        """Stop the reader and close both clients, within about ``timeout`` seconds. Closing the
        consumer first ends the reader's poll (its wait fails), so the reader stops at once."""
        self._stopping.set()
        if self._consumer is not None:
            try:
                self._consumer.close(timeout_ms=int(timeout * 1000))
            except Exception:
                log.debug("closing the command log's reader failed", exc_info=True)
        if self._thread is not None:
            self._thread.join(timeout)
        if self._producer is not None:
            try:
                self._producer.close(timeout=timeout)
            except Exception:
                log.debug("closing the command log's producer failed", exc_info=True)

    def command(self, command: Command, deadline: float) -> Outcome:
        """Append ``command`` and wait for its outcome, decided in log order.

        A producer that let a write time out is replaced before the next write:
        kafka-python's idempotent producer can be left without a producer id
        after a broker restart (its InitProducerId is never sent again), and
        would then time out every write for good.
        """
        producer = self._writer(deadline)
        self._follow_leader()
        request = next(self._requests)
        slot = self._slots[request] = _Slot()
        headers, value = encode(dataclasses.replace(command, origin=(self._session_id, request)))
        try:
            future = producer.send(self._settings.layout.topic, value=value, headers=headers, partition=0)
            future.add_errback(slot.fail)
            return slot.wait(deadline)
        except kerrors.KafkaError as exc:
            error = translate(exc, "the write")
            if isinstance(error, OperationTimeoutError):
                self._suspect(producer)
            raise error from None
        except OperationTimeoutError:
            self._suspect(producer)
            raise
        finally:
            self._slots.pop(request, None)

    def _new_producer(self, deadline: float, client: Callable[..., KafkaNetClient] | None = None) -> Any:
        request_ms = int(self._settings.request_timeout * 1000)
        extra = {} if client is None else {"kafka_client": client}
        return KafkaProducer(
            **self._settings.client(
                acks=-1,
                enable_idempotence=True,
                linger_ms=0,
                max_request_size=MAX_RECORD_BYTES,
                delivery_timeout_ms=request_ms,
                max_block_ms=request_ms,
                bootstrap_timeout_ms=max(1, int((deadline - time.monotonic()) * 1000)),
                **extra,
            )
        )

    def _suspect(self, producer: Any) -> None:
        with self._producer_lock:
            if producer is self._producer:
                self._suspected = True

    def _writer(self, deadline: float) -> Any:
        """The producer, replaced first if it let a write time out."""
        with self._producer_lock:
            if not self._suspected:
                return self._producer
            try:
                fresh = self._new_producer(deadline)
            except Exception as exc:
                raise OperationTimeoutError(
                    f"Kafka did not accept a new producer in time ({type(exc).__name__}); nothing was written"
                ) from None
            old, self._producer, self._suspected = self._producer, fresh, False
        log.info("replaced the command log's producer after a write timed out")
        threading.Thread(
            target=_close_quietly, args=(old,), name="consensus-kafka-close", daemon=True
        ).start()
        return fresh

    @property
    def session_id(self) -> str:
        """What names this session's commands in the log (their ``sid``)."""
        return self._session_id

    def end_offset(self, deadline: float) -> int:
        """The log's end offset (its high watermark): every command any reader applied lies below it."""
        try:
            return self._channel.end_offset(deadline)
        except kerrors.KafkaError as exc:
            raise translate(exc, "reading the end of the command log") from None

    def sync(self, deadline: float) -> None:
        """Wait until every write acknowledged before this call is applied."""
        end = self.end_offset(deadline)
        with self._applied:
            if not self._applied.wait_for(
                lambda: self._next_offset >= end, max(0.0, deadline - time.monotonic())
            ):
                raise timeout_error("the command log reader to catch up")

    def _follow_leader(self) -> None:
        """Give the producer's and the reader's metadata the log's leader the channel knows when its
        leader epoch is newer than theirs: kafka-python takes any broker's metadata whole, a
        deposed leader's too, which would keep both on a broker cut off from the cluster. Runs before
        each write and each poll, and on the channel's IO thread after every probe (it never blocks:
        the metadata has its own lock)."""
        hint = self._channel.leader_hint()
        if hint is None:
            return
        # kafka-python 3.0's metadata attributes (ClusterMetadata.update_partition_leader: newer only)
        for client, name in ((self._producer, "_metadata"), (self._consumer, "_cluster")):
            cluster = getattr(client, name, None)
            if cluster is not None:
                cluster.update_partition_leader(self._partition, *hint)

    def _tail(self) -> None:
        while not self._stopping.is_set():
            self._follow_leader()
            try:
                batches = self._consumer.poll(timeout_ms=POLL_MS)
            except Exception:
                if self._stopping.is_set():
                    return  # ``close`` closed the consumer under the poll
                log.warning("reading the command log failed; retrying", exc_info=True)
                self._stopping.wait(RETRY_S)
                continue
            records = batches.get(self._partition, [])
            for record in records:
                self._apply(record.offset, record.headers or [], record.value)
            if records:
                with self._applied:
                    self._next_offset = max(self._next_offset, records[-1].offset + 1)
                    self._applied.notify_all()

    def _apply(self, offset: int, headers: list[tuple[str, bytes]], value: bytes | None) -> None:
        command = decode(headers, value)
        if command is None:
            log.warning(
                "skipped record %d of %s: not a consensus-api command", offset, self._settings.layout.topic
            )
            return
        applied = self._state.apply(offset, command)
        if command.origin is not None and command.origin[0] == self._session_id:
            slot = self._slots.get(command.origin[1])
            if slot is not None:
                slot.settle(applied.outcome)
        if applied.targets or applied.departed_in:
            self._on_change(applied.targets, applied.departed_in)
