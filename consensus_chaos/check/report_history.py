"""What the report draws of one run, read from its history files: operations thinned to the drawing's
resolution, the nemesis' fault windows, and leaders, lock holders and resource owners over time.

Guarantees: an operation lasting at least ``LONG_COLUMNS`` columns of the drawing is kept as its own
bar; shorter ones are counted per process, pixel column and outcome with Arrow (a column showing
several operations takes the colour of the least certain outcome among them: ``info`` over ``fail``
over ``ok``), so what is drawn is bounded by the drawing's width and the number of lanes, not by the
history's length. At most ``MAX_LANES`` processes get a lane: the ones a finding cites, then the
others in lane order (chaos runs have a few dozen). Latencies are thinned the same way, to one dot per
column, latency bin and outcome. The items a finding cites are drawn from the finding itself
(``report_timeline``), so thinning never hides them. A run of more than ``MAX_RUN_ROWS`` rows is not
read at all (its memory would be about a kilobyte per row).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from consensus_chaos.check.local import history_files
from consensus_chaos.check.locks import holds
from consensus_chaos.record.schema import LOCK, NEMESIS, arrow_schema

#: An operation this many pixel columns long or longer is drawn as its own bar.
LONG_COLUMNS: Final = 2
#: The most processes drawn as lanes of one run.
MAX_LANES: Final = 100
#: The longest run (in rows) the report reads to draw.
MAX_RUN_ROWS: Final = 2_000_000
#: Latency bins per decade (the latency panel is about 30 pixels per decade).
BINS_PER_DECADE: Final = 12
#: The history columns the report reads.
COLUMNS: Final = (
    "run",
    "backend",
    "kind",
    "process",
    "client",
    "type",
    "f",
    "key",
    "value",
    "term",
    "service",
    "leader",
    "op_id",
    "error",
    "time_ns",
)
#: Outcomes, least certain first: a pixel column of several operations shows the first one present.
SEVERITY: Final = ("info", "fail", "ok")


@dataclass(frozen=True, slots=True)
class Lane:
    """One history process: its client slot and the time of its first and last row."""

    process: int
    client: int
    first: int
    last: int


@dataclass(frozen=True, slots=True)
class Bar:
    """Operations of one process drawn as one bar: one operation (``title`` says which), or the
    ``counts`` per outcome of the short operations in adjacent pixel columns ``start``..``end``."""

    process: int
    start: int
    end: int
    outcome: str
    title: str
    counts: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Fault:
    """A nemesis fault from its start to its heal (``end`` None: never healed)."""

    name: str
    target: str
    detail: str
    start: int
    end: int | None


@dataclass(frozen=True, slots=True)
class Span:
    """Something held over time on a strip row: a term of a leader, a lease, an owned resource."""

    start: int
    end: int | None
    holder: str
    label: str
    title: str


@dataclass
class RunView:
    """One run as the report draws it; times are ``time_ns``, pixel columns count from ``t0``."""

    run: str
    backend: str
    t0: int
    t1: int
    columns: int
    operations: int = 0
    lanes: list[Lane] = field(default_factory=list)
    #: Processes of the run without a lane (over ``MAX_LANES``).
    hidden_lanes: int = 0
    bars: list[Bar] = field(default_factory=list)
    #: Thinned latencies: (pixel column, latency in ns, outcome).
    latencies: list[tuple[int, int, str]] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    #: Strip rows per topic ("leader", "lock", "owner"): row name -> spans.
    strips: dict[str, dict[str, list[Span]]] = field(default_factory=dict)

    @property
    def ns_per_column(self) -> float:
        return max(self.t1 - self.t0, 1) / self.columns


def run_rows(directory: Path) -> dict[str, dict[Path, int]]:
    """Per run of the histories in ``directory``: its files and its rows in each (a cheap read of the
    dictionary-encoded ``run`` column)."""
    rows: defaultdict[str, dict[Path, int]] = defaultdict(dict)
    for path in history_files(directory):
        counts = pq.read_table(path, columns=["run"]).group_by("run").aggregate([("run", "count")])
        for row in counts.to_pylist():
            rows[row["run"]][path] = row["run_count"]
    return dict(rows)


def read_run(run: str, paths: Iterable[Path], columns: int, keep: Collection[int]) -> RunView:
    """The view of ``run`` from its files, ``COLUMNS`` only; the processes in ``keep`` get a lane."""
    schema = arrow_schema()
    schema = pa.schema([schema.field(name) for name in COLUMNS])
    parts = [pq.read_table(path, columns=list(COLUMNS), filters=[("run", "=", run)]) for path in paths]
    return run_view(pa.concat_tables([part.cast(schema) for part in parts]), columns, keep)


def run_view(table: Any, columns: int, keep: Collection[int] = ()) -> RunView:
    """The view of one run's rows (a ``pyarrow.Table`` with ``COLUMNS``)."""
    times = table.column("time_ns")
    view = RunView(
        str(table.column("run")[0]),
        str(table.column("backend")[0]),
        int(pc.min(times).as_py()),
        int(pc.max(times).as_py()),
        columns,
    )
    kind = table.column("kind")
    nemesis = table.filter(pc.equal(kind, NEMESIS))
    others = table.filter(pc.not_equal(kind, NEMESIS))
    lanes = _lanes(others)
    kept = [lane for lane in lanes if lane.process in keep]
    kept += [lane for lane in lanes if lane.process not in keep][: max(MAX_LANES - len(kept), 0)]
    drawn = {lane.process for lane in kept}
    view.lanes = [lane for lane in lanes if lane.process in drawn]  # in lane order
    view.hidden_lanes = len(lanes) - len(view.lanes)
    ops = _operations(others, view.t1)
    view.operations = ops.num_rows
    on_lanes = pc.is_in(ops.column("process"), pa.array(sorted(drawn), pa.int64()))
    view.bars = _bars(ops.filter(on_lanes), view)
    view.latencies = _latencies(ops, view)
    view.faults = _faults(nemesis.to_pylist())
    view.strips = {
        "leader": _leaders(table.filter(pc.equal(kind, "election"))),
        "lock": _holds(table.filter(pc.is_in(kind, pa.array([LOCK, NEMESIS])))),
        "owner": _owners(table.filter(pc.equal(kind, "coordinator"))),
    }
    return view


def _lanes(table: Any) -> list[Lane]:
    grouped = table.group_by("process").aggregate([("client", "min"), ("time_ns", "min"), ("time_ns", "max")])
    lanes = [
        Lane(row["process"], row["client_min"], row["time_ns_min"], row["time_ns_max"])
        for row in grouped.to_pylist()
    ]
    return sorted(lanes, key=lambda lane: (lane.client, lane.first, lane.process))


def _operations(table: Any, end_of_run: int) -> Any:
    """One row per operation: ``op_id``, ``process``, ``f``, ``key``, ``call``, ``ret``, ``outcome``;
    an operation without a completion is ``info`` until the end of the run."""
    with_id = table.filter(
        pc.and_(pc.is_valid(table.column("op_id")), pc.not_equal(table.column("type"), "event"))
    )
    invokes = with_id.filter(pc.equal(with_id.column("type"), "invoke"))
    invokes = invokes.select(["op_id", "process", "f", "key", "service", "time_ns"]).rename_columns(
        ["op_id", "process", "f", "key", "service", "call"]
    )
    done = with_id.filter(pc.not_equal(with_id.column("type"), "invoke")).select(["op_id", "type", "time_ns"])
    done = done.rename_columns(["op_id", "outcome", "ret"])
    ops = invokes.join(done, "op_id", join_type="left outer")
    ops = ops.set_column(
        ops.schema.get_field_index("outcome"), "outcome", pc.fill_null(ops.column("outcome"), "info")
    )
    return ops.set_column(
        ops.schema.get_field_index("ret"), "ret", pc.fill_null(ops.column("ret"), end_of_run)
    )


def _column(view: RunView, times: Any) -> Any:
    """The pixel column of each of ``times``."""
    scaled = pc.divide(pc.cast(pc.subtract(times, view.t0), "double"), view.ns_per_column)
    return pc.cast(pc.floor(pc.min_element_wise(scaled, view.columns - 1)), "int64")


def _bars(ops: Any, view: RunView) -> list[Bar]:
    long = pc.greater_equal(
        pc.subtract(ops.column("ret"), ops.column("call")), LONG_COLUMNS * view.ns_per_column
    )
    bars = [
        Bar(op["process"], op["call"], op["ret"], op["outcome"], _op_title(op, view.t0))
        for op in ops.filter(long).to_pylist()
    ]
    short = ops.filter(pc.invert(long))
    short = short.append_column("column", _column(view, short.column("call")))
    grouped = short.group_by(["process", "column", "outcome"]).aggregate([("op_id", "count")])
    cells: defaultdict[tuple[int, int], dict[str, int]] = defaultdict(dict)
    for row in grouped.to_pylist():
        cells[(row["process"], row["column"])][row["outcome"]] = row["op_id_count"]
    runs: list[_Cells] = []  # adjacent columns of one process and colour, merged
    for (process, column), counts in sorted(cells.items()):
        outcome = next(o for o in SEVERITY if o in counts)
        last = runs[-1] if runs else None
        if last is not None and (last.process, last.last + 1, last.outcome) == (process, column, outcome):
            last.last = column
            for name, count in counts.items():
                last.counts[name] = last.counts.get(name, 0) + count
        else:
            runs.append(_Cells(process, column, column, outcome, dict(counts)))
    return bars + [cells_run.bar(view) for cells_run in runs]


@dataclass(slots=True)
class _Cells:
    """Short operations of one process in pixel columns ``first``..``last``, drawn in one colour."""

    process: int
    first: int
    last: int
    outcome: str
    counts: dict[str, int]

    def bar(self, view: RunView) -> Bar:
        start = view.t0 + round(self.first * view.ns_per_column)
        end = view.t0 + round((self.last + 1) * view.ns_per_column)
        parts = ", ".join(f"{self.counts[o]} {o}" for o in SEVERITY if self.counts.get(o))
        when = f"{_at(start, view.t0)}-{_at(end, view.t0)}"
        title = f"process {self.process}: {sum(self.counts.values())} operations ({parts}) {when}"
        return Bar(self.process, start, end, self.outcome, title, self.counts)


def _op_title(op: Mapping[str, Any], t0: int) -> str:
    target = op["key"] or op["service"] or ""
    return (
        f"op {op['op_id']}, process {op['process']}: {op['f']} {target} -> {op['outcome']}, "
        f"{_at(op['call'], t0)} for {(op['ret'] - op['call']) / 1e6:.1f} ms"
    )


def _at(time_ns: int, t0: int) -> str:
    return f"+{(time_ns - t0) / 1e9:.3f}s"


def _latencies(ops: Any, view: RunView) -> list[tuple[int, int, str]]:
    latency = pc.max_element_wise(pc.subtract(ops.column("ret"), ops.column("call")), 1)
    table = ops.select(["outcome"]).append_column("latency", latency)
    table = table.append_column("column", _column(view, ops.column("call")))
    bins = pc.cast(pc.floor(pc.multiply(pc.log10(pc.cast(latency, "double")), BINS_PER_DECADE)), "int64")
    table = table.append_column("bin", bins)
    grouped = table.group_by(["column", "bin", "outcome"]).aggregate([("latency", "max")])
    return sorted((row["column"], row["latency_max"], row["outcome"]) for row in grouped.to_pylist())


def _faults(rows: list[dict[str, Any]]) -> list[Fault]:
    started: dict[int, dict[str, Any]] = {}
    faults = []
    for row in sorted(rows, key=lambda r: r["time_ns"]):
        if row["type"] == "invoke":
            started[row["op_id"]] = row
        elif (begun := started.pop(row["op_id"], None)) is not None:
            target = str(begun["value"] or "")
            detail = str(row["value"] or "")
            faults.append(Fault(str(begun["f"]), target, detail, begun["time_ns"], row["time_ns"]))
    faults += [
        Fault(str(r["f"]), str(r["value"] or ""), "never healed", r["time_ns"], None)
        for r in started.values()
    ]
    return sorted(faults, key=lambda fault: fault.start)


def _leaders(table: Any) -> dict[str, list[Span]]:
    """Per service: each term from its first sighting (a leader event, a ``leadership()`` read, a
    final read) to the first sighting of a higher term, cut short by the first sign nobody leads
    (a leader event without a term) after it began; stale sightings of older terms are ignored."""
    seen: defaultdict[str, list[tuple[int, int | None, str]]] = defaultdict(list)
    for row in table.to_pylist():
        sighting = (row["type"] == "event" and row["f"] in ("leader", "final")) or (
            row["type"] == "ok" and row["f"] == "leadership"
        )
        if sighting and row["service"] is not None:
            seen[row["service"]].append((row["time_ns"], row["term"], str(row["leader"] or "")))
    strips: dict[str, list[Span]] = {}
    for service, sightings in sorted(seen.items()):
        spans: list[Span] = []
        term: int | None = None
        for at, sighted, leader in sorted(sightings, key=lambda s: s[0]):
            if sighted is not None and (term is None or sighted > term):
                _close(spans, at)
                term = sighted
                title = f"{leader} leads {service}, term {sighted}, first seen at {at}"
                spans.append(Span(at, None, leader, f"{leader} t{sighted}", title))
            elif sighted is None and _open(spans) and spans[-1].holder:
                _close(spans, at)
                spans.append(Span(at, None, "", "no leader", f"nobody leads {service} (after term {term})"))
        strips[service] = spans
    return strips


def _open(spans: list[Span]) -> bool:
    return bool(spans) and spans[-1].end is None


def _close(spans: list[Span], at: int) -> None:
    if _open(spans):
        last = spans[-1]
        spans[-1] = Span(last.start, at, last.holder, last.label, last.title)


def _holds(table: Any) -> dict[str, list[Span]]:
    """Per lock: each lease from its grant to its end, as the ``locks`` check sees them."""
    rows = table.to_pylist()
    strips: defaultdict[str, list[Span]] = defaultdict(list)
    for hold in holds(rows) if any(row["kind"] == LOCK for row in rows) else []:
        mode = "exclusive" if hold.exclusive else "shared"
        title = f"{hold.holder} (process {hold.process}) holds {hold.lock}, {mode}, token {hold.token}"
        strips[hold.lock].append(
            Span(hold.start, hold.end, hold.holder, f"p{hold.process} t{hold.token}", title)
        )
    return dict(sorted(strips.items()))


def _owners(table: Any) -> dict[str, list[Span]]:
    """Per resource: who owned it, from each ``assigned`` to the ``revoked`` of the same process."""
    owning: dict[tuple[int, str], int] = {}
    strips: defaultdict[str, list[Span]] = defaultdict(list)
    for row in sorted(table.to_pylist(), key=lambda r: r["time_ns"]):
        process, resource = row["process"], str(row["key"])
        if row["f"] == "assigned":
            owning.setdefault((process, resource), row["time_ns"])
        elif row["f"] == "revoked" and (process, resource) in owning:
            start = owning.pop((process, resource))
            strips[resource].append(
                Span(
                    start, row["time_ns"], f"p{process}", f"p{process}", f"process {process} owns {resource}"
                )
            )
    for (process, resource), start in owning.items():
        strips[resource].append(
            Span(start, None, f"p{process}", f"p{process}", f"process {process} owns {resource}")
        )
    return dict(sorted(strips.items()))
