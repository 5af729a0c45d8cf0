"""PostgreSQL's asyncio storage (``consensus_backends.sql.aio``) against a real server: the blocking
calls' results and errors, the fence, 1,000 fetches in flight, and through ``consensus_api.aio``
no worker thread in the way; SQLite and MariaDB offer none."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from async_face_support import fences_as_blocking, many_in_flight, same_as_blocking
from etcd_support import Recorder

import consensus_api as ca
from consensus_api import aio
from consensus_api.config import build_options, parse_url
from consensus_backends.sql import SQLBackend
from consensus_testkit import ServerHandle


def _open(url: str) -> SQLBackend:
    parsed, options = parse_url(url)
    backend = SQLBackend(
        parsed, build_options(options, SQLBackend.options, parsed.scheme, parsed), Recorder()
    )
    backend.open()
    return backend


@pytest.fixture
def backend(postgresql_target: str) -> Iterator[SQLBackend]:
    opened = _open(postgresql_target)
    yield opened
    opened.close()


def test_same_results_and_errors_as_the_blocking_calls(backend: SQLBackend) -> None:
    asyncio.run(same_as_blocking(backend))


def test_fenced_writes_are_refused_as_the_blocking_ones(backend: SQLBackend) -> None:
    asyncio.run(fences_as_blocking(backend))


def test_a_thousand_fetches_in_flight(backend: SQLBackend) -> None:
    asyncio.run(many_in_flight(backend))


def test_sqlite_has_no_async_face(tmp_path: Path) -> None:
    backend = _open(f"sqlite:///{tmp_path / 'db.sqlite'}")
    try:

        async def face() -> object:
            return backend.async_storage()

        assert asyncio.run(face()) is None
    finally:
        backend.close()


def test_aio_storage_needs_no_worker_thread(postgresql_target: str) -> None:
    """With ``workers=1`` and that one worker waiting in line for a lock, 1,000 gathered fetches (and
    the write before them) complete: storage calls never wait for a worker thread."""
    name, key = f"lock-{uuid.uuid4().hex[:8]}", f"k/{uuid.uuid4().hex[:8]}"

    async def main() -> None:
        async with (
            aio.connect(postgresql_target) as other,
            aio.connect(postgresql_target, workers=1) as session,
        ):
            holder = other.lock(name)
            held = await holder.acquire()
            assert held is not None
            waiter = asyncio.create_task(session.lock(name).acquire(timeout=120))
            try:
                version = await session.storage.put(key, b"v")
                answers = await asyncio.wait_for(
                    asyncio.gather(*(session.storage.fetch(key) for _ in range(1_000))), timeout=60
                )
                assert answers == [ca.Versioned(b"v", version)] * 1_000
                assert not waiter.done()  # the session's only worker was busy throughout
            finally:
                await holder.release()
                lease = await asyncio.wait_for(waiter, timeout=60)
            assert lease is not None
            await session.storage.delete(key, version=version)

    asyncio.run(main())


#: A child process (global OpenTelemetry providers are set once per process): awaited storage calls
#: on PostgreSQL's asyncio storage, then the operations measured and the spans finished.
MEASURED_CHILD = """
import asyncio, json, sys
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
import consensus_api as ca
from consensus_api import aio

reader, spans = InMemoryMetricReader(), InMemorySpanExporter()
metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(spans))
trace.set_tracer_provider(provider)

async def main():
    async with aio.connect(sys.argv[1], workers=1) as session:
        await session.storage.put("m/k", b"v")
        try:
            await session.storage.put("m/k", b"again")
        except ca.KeyExistsError:
            pass
        await session.storage.fetch("m/k")
        await session.storage.keys("m")

asyncio.run(main())
errors = []
counts = {}
for resource in reader.get_metrics_data().resource_metrics:
    for scope in resource.scope_metrics:
        for metric in scope.metrics:
            for point in metric.data.data_points:
                attributes = dict(point.attributes)
                if metric.name == "consensus.operation.duration":
                    counts[attributes["consensus.operation"]] = point.count
                if metric.name == "consensus.operation.errors":
                    errors.append([attributes["consensus.operation"], attributes["error.type"]])
names = sorted({span.name for span in spans.get_finished_spans()})
print(json.dumps({"counts": counts, "errors": errors, "spans": names}))
"""


def test_awaited_storage_calls_are_measured_and_traced(postgresql_target: str) -> None:
    output = subprocess.run(
        [sys.executable, "-c", MEASURED_CHILD, postgresql_target],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    seen = json.loads(output)
    assert seen["counts"] == {"put": 2, "fetch": 1, "keys": 1}
    assert seen["errors"] == [["put", "KeyExistsError"]]
    assert {"consensus.put", "consensus.fetch", "consensus.keys"} <= set(seen["spans"])


def test_reads_and_writes_end_within_request_timeout_on_a_frozen_server(
    postgresql_target: str, postgresql_server: ServerHandle
) -> None:
    """A frozen server (SIGSTOP): reads queued on the face fail with ``OperationTimeoutError`` at
    their deadline, a write too; once the server is back, the face reads again (new connections)."""
    backend = _open(postgresql_target.replace("?", "?request_timeout=2&", 1))

    async def scenario() -> None:
        face = backend.async_storage()
        assert face is not None
        try:
            version = await face.put("k", b"v", None)
            postgresql_server.pause()
            try:
                started = time.monotonic()
                outcomes = await asyncio.gather(
                    *(face.fetch("k") for _ in range(20)),
                    face.put("other", b"x", None),
                    return_exceptions=True,
                )
                assert all(isinstance(each, ca.OperationTimeoutError) for each in outcomes), outcomes
                assert time.monotonic() - started < 8
            finally:
                postgresql_server.resume()
            assert await face.fetch("k") == ca.Versioned(b"v", version)
        finally:
            await face.aclose()

    try:
        asyncio.run(scenario())
    finally:
        backend.close()


def test_a_sealed_store_refuses_writes_through_the_face(backend: SQLBackend) -> None:
    """The seal (a migration's cut-over) holds for the face's writes: the same storage functions."""

    async def scenario() -> None:
        face = backend.async_storage()
        assert face is not None
        try:
            version = await face.put("s", b"v", None)
            backend.seal()
            try:
                writes = [
                    face.put("t", b"v", None),
                    face.update("s", b"w", None, None),
                    face.delete("s", None, None),
                ]
                for write in writes:
                    with pytest.raises(ca.SealedError):
                        await write
                assert await face.fetch("s") == ca.Versioned(b"v", version)
            finally:
                backend.unseal()
            await face.delete("s", version, None)
        finally:
            await face.aclose()

    asyncio.run(scenario())
