"""Metrics, traces and logging (consensus_api.observability) with a real OpenTelemetry SDK."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import consensus_api as ca

CLI = [sys.executable, "-m", "consensus_api.cli"]
SECRET = "s3cret-pw"
#: Lines of a child process's script that set ``counts``: the calls ``reader`` measured, per operation.
COUNTS_BY_OPERATION = """counts = {
    dict(point.attributes)["consensus.operation"]: point.count
    for resource in reader.get_metrics_data().resource_metrics
    for scope in resource.scope_metrics
    for metric in scope.metrics
    if metric.name == "consensus.operation.duration"
    for point in metric.data.data_points
}
"""


@pytest.fixture(scope="module")
def telemetry() -> tuple[InMemoryMetricReader, InMemorySpanExporter]:
    """The process's global meter and tracer providers, recording in memory (set once per process)."""
    reader, spans = InMemoryMetricReader(), InMemorySpanExporter()
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    trace.set_tracer_provider(tracer_provider)
    return reader, spans


def points(reader: InMemoryMetricReader) -> dict[str, list[tuple[dict[str, Any], Any]]]:
    """Every metric's data points as (attributes, point)."""
    found: dict[str, list[tuple[dict[str, Any], Any]]] = {}
    data = reader.get_metrics_data()
    for resource in data.resource_metrics if data else []:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                found.setdefault(metric.name, []).extend(
                    (dict(point.attributes or {}), point) for point in metric.data.data_points
                )
    return found


def test_library_logger_has_a_null_handler() -> None:
    assert any(isinstance(h, logging.NullHandler) for h in logging.getLogger("consensus_api").handlers)


def test_operations_errors_listeners_and_rebalances_are_measured(
    telemetry: tuple[InMemoryMetricReader, InMemorySpanExporter], tmp_path: Path
) -> None:
    reader, spans = telemetry
    with ca.connect(f"sqlite:///{tmp_path / 'm.db'}") as session:
        session.storage.put("k", b"v")
        with pytest.raises(ca.KeyExistsError):
            session.storage.put("k", b"again")
        seen: list[ca.Event] = []
        session.group("g").add_listener(seen.append)
        session.election("s").add_listener(seen.append)
        deadline = time.monotonic() + 10
        while not any(isinstance(e, ca.LeaderChanged) for e in seen):  # nobody leads yet: not a change
            assert time.monotonic() < deadline, seen
            time.sleep(0.01)
        session.group("g").join("m1")
        session.election("s").nominate("m1")
        handler = ca.ResourceHandler(["r1", "r2"], _Quiet())
        coordinator = session.coordinator("c", "consumer", handler, rebalance_timeout=5)
        generation = coordinator.ensure_active_group()
        deadline = time.monotonic() + 10
        while not any(isinstance(e, ca.LeaderChanged) and e.leader_id for e in seen):
            assert time.monotonic() < deadline, seen
            time.sleep(0.05)
        session.storage.put("k2", b"v")  # the listeners' reads are done by now
        assert session.storage.fetch_nowait("k2") is not None  # an event loop's read, measured too
    found = points(reader)
    durations = {attributes["consensus.operation"] for attributes, _ in found["consensus.operation.duration"]}
    assert {"put", "join", "nominate", "membership", "leadership", "fetch"} <= durations
    assert all(a["consensus.backend"] == "sqlite" for a, _ in found["consensus.operation.duration"])
    errors = found["consensus.operation.errors"]
    assert any(a["error.type"] == "KeyExistsError" and a["consensus.operation"] == "put" for a, _ in errors)
    assert any(a["consensus.group"] == "g" and p.value == 1 for a, p in found["consensus.group.members"])
    changes = found["consensus.election.leadership_changes"]
    assert sum(p.value for a, p in changes if a["consensus.service"] == "s") >= 1
    assert any(
        p.value >= 1 for a, p in found["consensus.coordinator.rebalances"] if a["consensus.group"] == "c"
    )
    generations = [
        p.value for a, p in found["consensus.coordinator.generation"] if a["consensus.group"] == "c"
    ]
    assert generations == [generation.generation_id]
    assert "consensus.put" in {span.name for span in spans.get_finished_spans()}


def test_no_secret_in_logs_metrics_or_spans(
    telemetry: tuple[InMemoryMetricReader, InMemorySpanExporter],
    postgresql_target: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    reader, spans = telemetry
    url = postgresql_target.replace("postgres@", f"postgres:{SECRET}@", 1)
    assert SECRET in url
    with caplog.at_level(logging.DEBUG, logger="consensus_api"), ca.connect(url) as session:
        session.storage.put("k", b"value")
        with pytest.raises(ca.KeyExistsError):
            session.storage.put("k", b"value")
        assert SECRET not in repr(session)
    recorded = [caplog.text, repr(points(reader))]
    recorded += [repr(dict(span.attributes or {})) for span in spans.get_finished_spans()]
    assert not [text for text in recorded if SECRET in text]


def test_demo_serves_prometheus_metrics(tmp_path: Path) -> None:
    """``consensus demo --metrics-port N``: /metrics shows operation histograms and leadership changes."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    demo = subprocess.Popen(
        [*CLI, "demo", "--url", f"sqlite:///{tmp_path / 'demo.db'}", "--metrics-port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        text = ""
        deadline = time.monotonic() + 30
        while "consensus_election_leadership_changes_total{" not in text:
            assert demo.poll() is None, demo.stderr.read() if demo.stderr else ""
            assert time.monotonic() < deadline, text
            time.sleep(0.2)
            text = _scrape(port)
        assert "consensus_operation_duration_seconds_bucket{" in text
        assert 'consensus_operation="leadership"' in text
        assert demo.wait(60) == 0
    finally:
        demo.kill()
        demo.wait()


def test_without_the_extras_nothing_is_recorded_and_export_names_the_extra(tmp_path: Path) -> None:
    script = f"""
import sys
sys.modules["opentelemetry"] = None
import consensus_api as ca
from consensus_api import observability
with ca.connect("sqlite:///{tmp_path / "x.db"}") as session:
    session.storage.put("k", b"v")
    assert session._telemetry is None
try:
    observability.serve_prometheus(1)
except ca.ConfigurationError as exc:
    print(exc)
"""
    result = subprocess.run(
        [sys.executable, "-c", script], check=False, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "consensus-api[prometheus]" in result.stdout
    assert "opentelemetry" not in result.stderr


def _scrape(port: int) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            return str(response.read().decode())
    except OSError:
        return ""


class _Quiet:
    def on_assigned(self, resources: frozenset[str]) -> None:
        pass

    def on_revoked(self, resources: frozenset[str]) -> None:
        pass


def test_spans_start_once_a_tracer_provider_is_installed(tmp_path: Path) -> None:
    """Before the application installs a tracer provider no span is opened; a session opened then
    traces its calls from the moment one is installed, and measures every call throughout."""
    script = f"""
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
import consensus_api as ca
reader, spans = InMemoryMetricReader(), InMemorySpanExporter()
metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
with ca.connect("sqlite:///{tmp_path / "x.db"}") as session:
    session.storage.put("k", b"v")
    assert session._telemetry._instruments.tracing() is False
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    trace.set_tracer_provider(provider)
    session.storage.fetch("k")
names = [span.name for span in spans.get_finished_spans()]
{COUNTS_BY_OPERATION}print(names, counts)
assert names == ["consensus.fetch"], names
assert counts == {{"put": 1, "fetch": 1}}, counts
"""
    result = subprocess.run(
        [sys.executable, "-c", script], check=False, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr + result.stdout


def test_calls_are_measured_from_the_moment_a_meter_provider_is_installed(tmp_path: Path) -> None:
    """With the otel extra but no provider a call is not measured (every record would be a no-op);
    a session opened then measures its calls from the first one after a meter provider is installed."""
    script = f"""
from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
import consensus_api as ca
reader = InMemoryMetricReader()
with ca.connect("sqlite:///{tmp_path / "x.db"}") as session:
    session.storage.put("k", b"v")
    session.storage.keys()
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    session.storage.fetch("k")
    session.storage.fetch("k")
{COUNTS_BY_OPERATION}assert counts == {{"fetch": 2}}, counts
"""
    result = subprocess.run(
        [sys.executable, "-c", script], check=False, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr + result.stdout
