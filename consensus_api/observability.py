"""Metrics, traces and logging of consensus-api (<https://consensus-api.github.io/consensus-api/spec/#17-asyncio-and-observability>).

Logging: every logger is below ``consensus_api`` (``consensus_api.coordinator``,
``.sql``, ``.etcd``, ``.zookeeper``, ``.kafka``, ``.migrate``, ``.aio``); the
root one has a ``NullHandler``, so the library prints nothing unless the
application configures logging. Nothing on the hot path logs at INFO or above.

Metrics and traces: with the ``otel`` extra (``opentelemetry-api``) installed,
every session records the instruments named below through the global
OpenTelemetry meter and tracer providers (no-op until the application installs
an SDK). Until the application installs a meter or tracer provider, every record
would be a no-op, so operations are not measured at all (the wrapper and its
clock reads cost a call 10-15 µs of CPU on a cold cache); from the first call
after one is installed, they are. Without the extra nothing is recorded and
nothing is imported. Attributes are
the backend, the operation, the error type, the state, the group or service:
never a key, a value, member data or a URL's credentials.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, cast

from consensus_api._version import __version__
from consensus_api.backend import WouldBlock
from consensus_api.errors import ConfigurationError
from consensus_api.model import Event, LeaderChanged, MembershipChanged, SessionState

if TYPE_CHECKING:
    from consensus_api.backend import AsyncStorage, Backend, Reader, Writer
    from consensus_api.coordinator import CoordinatorHandler

logging.getLogger("consensus_api").addHandler(logging.NullHandler())

#: The backend calls whose latency and errors are measured (``walk`` streams pages: not one call).
OPERATIONS = frozenset(
    {"fetch", "put", "update", "delete", "keys", "join", "leave", "membership", "nominate", "resign"}
    | {"leadership", "server_version"}
)
OTEL_EXTRA = "otel"
PROMETHEUS_EXTRA = "prometheus"

_lock = threading.Lock()
_instruments: _Instruments | None = None


def otel_installed() -> bool:
    """True when the ``otel`` extra (opentelemetry-api) is importable (then it is imported)."""
    try:
        import opentelemetry.metrics  # noqa: PLC0415 - the optional otel extra
        import opentelemetry.trace  # noqa: PLC0415, F401 - the optional otel extra
    except ImportError:
        return False
    return True


class _Instruments:
    """The process's OpenTelemetry instruments, created once (lazily) on the global providers."""

    def __init__(self) -> None:
        from opentelemetry import metrics, trace  # noqa: PLC0415 - the optional otel extra

        metrics.get_meter_provider()  # loads a provider named by OTEL_PYTHON_METER_PROVIDER, if any
        trace.get_tracer_provider()  # likewise OTEL_PYTHON_TRACER_PROVIDER
        meter = metrics.get_meter("consensus_api", __version__)
        self.tracer = trace.get_tracer("consensus_api", __version__)
        # Where the API keeps the providers the application installs (None until then). The getters
        # (which first load a provider the environment names) read the environment at every call:
        # 1.7 µs, more than measuring costs, so ``recording`` and ``tracing`` read these instead.
        self._meter_globals: object = None  # another API version: measure every call, as before
        with contextlib.suppress(ImportError):
            self._meter_globals = importlib.import_module("opentelemetry.metrics._internal")
        self._tracer_globals: object = trace
        self._tracing = False
        self._recording = False
        self.duration = meter.create_histogram(
            "consensus.operation.duration", unit="s", description="Latency of one backend call"
        )
        self.errors = meter.create_counter(
            "consensus.operation.errors", description="Backend calls that raised, by error type"
        )
        self.states = meter.create_counter(
            "consensus.session.state_changes", description="Session state changes, by new state"
        )
        self.lag = meter.create_histogram(
            "consensus.listener.delivery_lag",
            unit="s",
            description="From a backend's change notification to the re-read delivered to listeners",
        )
        self.members = meter.create_gauge(
            "consensus.group.members", description="Live members of a watched group"
        )
        self.leadership_changes = meter.create_counter(
            "consensus.election.leadership_changes", description="Changes of leader seen by listeners"
        )
        self.rebalances = meter.create_counter(
            "consensus.coordinator.rebalances", description="Completed rebalances (joins) of a coordinator"
        )
        self.rebalance_duration = meter.create_histogram(
            "consensus.coordinator.rebalance.duration",
            unit="s",
            description="From on_join_prepare to on_join_complete",
        )
        self.generation = meter.create_gauge(
            "consensus.coordinator.generation", description="The generation a coordinator last joined"
        )

    def tracing(self) -> bool:
        """Whether the application installed a tracer provider; until then every span is a no-op
        and is not opened (it would cost a call several µs). A provider is installed only once."""
        if not self._tracing:
            self._tracing = _installed(self._tracer_globals, "_TRACER_PROVIDER")
        return self._tracing

    def recording(self) -> bool:
        """Whether the application installed a meter or a tracer provider: until then every
        instrument is the API's no-op proxy and nothing needs measuring. A provider, once
        installed, stays (OpenTelemetry sets the global providers only once)."""
        if not self._recording:
            self._recording = _installed(self._meter_globals, "_METER_PROVIDER") or self.tracing()
        return self._recording


def _installed(module: object, provider: str) -> bool:
    """Whether ``module``'s global ``provider`` is set: the application installed one. A missing
    global or module (another API version) counts as installed, so calls are measured as before."""
    return getattr(module, provider, True) is not None


def _shared_instruments() -> _Instruments:
    global _instruments
    with _lock:
        if _instruments is None:
            _instruments = _Instruments()
        return _instruments


class SessionTelemetry:
    """What one session records; built by :func:`for_session` only when the ``otel`` extra is present."""

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self._instruments = _shared_instruments()
        #: Whether calls are worth measuring now: a meter or tracer provider is installed.
        self.recording: Callable[[], bool] = self._instruments.recording
        self._leaders: dict[str, str | None] = {}
        self._attributes: dict[str, dict[str, str]] = {}

    def measured(self, backend: Backend) -> Backend:
        """``backend`` with each call of :data:`OPERATIONS` timed and traced."""
        return cast("Backend", _MeasuredBackend(backend, self))

    def measured_async(self, face: AsyncStorage) -> AsyncStorage:
        """``face`` (a backend's asyncio storage) with each call timed and traced once a meter or
        tracer provider is installed, like ``measured``."""
        return cast("AsyncStorage", _MeasuredAsyncStorage(face, self))

    def state_changed(self, state: SessionState) -> None:
        self._instruments.states.add(1, {"consensus.backend": self.backend, "consensus.state": state.value})

    def event_read(self, event: Event, lag: float | None) -> None:
        """A listener target was re-read; ``lag``: seconds since the change notification, if any."""
        attributes: dict[str, str] = {"consensus.backend": self.backend}
        if lag is not None:
            self._instruments.lag.record(lag, {**attributes, "consensus.event": type(event).__name__})
        if isinstance(event, MembershipChanged):
            self._instruments.members.set(len(event.members), {**attributes, "consensus.group": event.group})
        elif isinstance(event, LeaderChanged):
            previous = self._leaders.get(event.service, event.leader_id)
            self._leaders[event.service] = event.leader_id
            if previous != event.leader_id:
                attributes["consensus.service"] = event.service
                self._instruments.leadership_changes.add(1, attributes)

    def observed_handler(self, handler: CoordinatorHandler, group: str) -> CoordinatorHandler:
        """``handler`` with its rebalances counted and timed; returned as is if it lacks a callback
        (the coordinator then reports that)."""
        names = ("metadata", "on_join_prepare", "perform_assignment", "on_join_complete", "on_leave_prepare")
        if not all(callable(getattr(handler, name, None)) for name in names):
            return handler
        return cast("CoordinatorHandler", _ObservedHandler(handler, group, self))

    def _attributes_of(self, operation: str) -> dict[str, str]:
        attributes = self._attributes.get(operation)
        if attributes is None:  # one dict per operation, never changed once made
            attributes = {"consensus.backend": self.backend, "consensus.operation": operation}
            self._attributes[operation] = attributes
        return attributes

    def call(self, operation: str, method: Callable[..., Any], *args: Any) -> Any:
        attributes = self._attributes_of(operation)
        instruments = self._instruments
        if not instruments.tracing():
            return self._measure(attributes, method, args)
        with instruments.tracer.start_as_current_span(f"consensus.{operation}", attributes=attributes):
            return self._measure(attributes, method, args)

    def _measure(self, attributes: dict[str, str], method: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        """``method(*args)``, its duration and any error recorded."""
        instruments = self._instruments
        started = time.perf_counter()
        try:
            return method(*args)
        except WouldBlock:  # did nothing: the ordinary call follows, and is measured
            raise
        except Exception as exc:
            instruments.errors.add(1, {**attributes, "error.type": type(exc).__name__})
            raise
        finally:
            instruments.duration.record(time.perf_counter() - started, attributes)

    def acall(self, operation: str, method: Callable[..., Awaitable[Any]], *args: Any) -> Awaitable[Any]:
        """``method(*args)`` to await, measured and traced like ``call`` while ``recording()``
        (until then the call itself: no further coroutine in the way)."""
        if not self.recording():
            return method(*args)
        return self._atraced(operation, method, args)

    async def _atraced(
        self, operation: str, method: Callable[..., Awaitable[Any]], args: tuple[Any, ...]
    ) -> Any:
        attributes = self._attributes_of(operation)
        instruments = self._instruments
        if not instruments.tracing():
            return await self._ameasure(attributes, method, args)
        with instruments.tracer.start_as_current_span(f"consensus.{operation}", attributes=attributes):
            return await self._ameasure(attributes, method, args)

    async def _ameasure(
        self, attributes: dict[str, str], method: Callable[..., Awaitable[Any]], args: tuple[Any, ...]
    ) -> Any:
        instruments = self._instruments
        started = time.perf_counter()
        try:
            return await method(*args)
        except Exception as exc:
            instruments.errors.add(1, {**attributes, "error.type": type(exc).__name__})
            raise
        finally:
            instruments.duration.record(time.perf_counter() - started, attributes)

    def rebalanced(self, group: str, generation: int, seconds: float | None) -> None:
        attributes = {"consensus.backend": self.backend, "consensus.group": group}
        self._instruments.rebalances.add(1, attributes)
        self._instruments.generation.set(generation, attributes)
        if seconds is not None:
            self._instruments.rebalance_duration.record(seconds, attributes)


def for_session(backend: str) -> SessionTelemetry | None:
    """The telemetry of a new session on ``backend``; None (record nothing) without the ``otel`` extra."""
    return SessionTelemetry(backend) if otel_installed() else None


class _MeasuredBackend:
    """A backend (or its nowait reader or writer) seen through its telemetry; every other attribute
    is its own."""

    def __init__(self, backend: Backend | Reader | Writer, telemetry: SessionTelemetry) -> None:
        self._backend = backend
        self._telemetry = telemetry
        #: The measured views of the nowait reader and writer, by identity: made once, not per call.
        self._views: dict[int, _MeasuredBackend] = {}

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._backend, name)
        if name in ("nowait_reader", "nowait_writer"):  # their calls are measured like the backend's own
            measured_view = functools.partial(self._view, attribute)
            self.__dict__[name] = measured_view
            return measured_view
        if name not in OPERATIONS:
            return attribute
        measured = functools.partial(self._telemetry.call, name, attribute)
        self.__dict__[name] = measured  # found without ``__getattr__`` from now on
        return measured

    def _view(self, get: Callable[[], Reader | Writer | None]) -> _MeasuredBackend | None:
        """What ``get()`` returns, measured; the same view for the same object."""
        inner = get()
        if inner is None:
            return None
        view = self._views.get(id(inner))
        if view is None:
            view = self._views[id(inner)] = _MeasuredBackend(inner, self._telemetry)
        return view


class _MeasuredAsyncStorage:
    """A backend's asyncio storage seen through its telemetry (``acall``); ``aclose`` is its own."""

    def __init__(self, face: AsyncStorage, telemetry: SessionTelemetry) -> None:
        self._face = face
        self._telemetry = telemetry

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._face, name)
        if name not in OPERATIONS:
            return attribute
        measured = functools.partial(self._telemetry.acall, name, attribute)
        self.__dict__[name] = measured
        return measured


class _ObservedHandler:
    """A coordinator handler that also records each rebalance's generation and duration."""

    def __init__(self, handler: CoordinatorHandler, group: str, telemetry: SessionTelemetry) -> None:
        self._handler = handler
        self._group = group
        self._telemetry = telemetry
        self._prepared_at: float | None = None

    def metadata(self) -> Any:
        return self._handler.metadata()

    def on_join_prepare(self, generation: int, member_id: str) -> None:
        self._prepared_at = time.monotonic()
        self._handler.on_join_prepare(generation, member_id)

    def perform_assignment(self, leader_id: str, protocol: str, members: Mapping[str, bytes]) -> Any:
        return self._handler.perform_assignment(leader_id, protocol, members)

    def on_join_complete(self, generation: int, member_id: str, protocol: str, assignment: bytes) -> None:
        started, self._prepared_at = self._prepared_at, None
        seconds = None if started is None else time.monotonic() - started
        self._telemetry.rebalanced(self._group, generation, seconds)
        self._handler.on_join_complete(generation, member_id, protocol, assignment)

    def on_leave_prepare(self) -> None:
        self._handler.on_leave_prepare()


def serve_prometheus(port: int, host: str = "127.0.0.1") -> None:
    """Export every metric above at ``http://host:port/metrics`` (Prometheus text format) from now on.

    Installs an OpenTelemetry SDK meter provider with a Prometheus reader; needs
    the ``prometheus`` extra, else ``ConfigurationError`` naming it.
    """
    try:
        from opentelemetry import metrics  # noqa: PLC0415 - the optional prometheus extra
        from opentelemetry.exporter.prometheus import PrometheusMetricReader  # noqa: PLC0415 - likewise
        from opentelemetry.sdk.metrics import MeterProvider  # noqa: PLC0415 - likewise
        from prometheus_client import start_http_server  # noqa: PLC0415 - likewise
    except ImportError as exc:
        raise ConfigurationError(
            f"metrics export needs the {PROMETHEUS_EXTRA!r} extra: pip install "
            f"'consensus-api[{PROMETHEUS_EXTRA}]' ({exc.name} is missing)"
        ) from None
    try:
        start_http_server(port, addr=host)
    except OSError as exc:
        raise ConfigurationError(f"cannot serve metrics on {host}:{port}: {exc.strerror}") from None
    metrics.set_meter_provider(MeterProvider(metric_readers=[PrometheusMetricReader()]))
