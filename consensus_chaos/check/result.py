"""The outcome of a check: verdicts per check, the findings, and the measurements for a report.

Exit codes: 0 every check passed; 1 a violation was found; 3 only
``unknown`` verdicts (a per-object budget ran out) stand in the way; 2 the
history is invalid (for instance a process with two operations open).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Final

from consensus_chaos.check.bucket import CHECKS, LATENCY, STAT, SUMMARY
from consensus_chaos.check.histogram import Histogram
from consensus_chaos.check.ops import INVALID, PASS, UNKNOWN, VIOLATION

ALL_CHECKS: Final = tuple(check for checks in CHECKS.values() for check in checks)
EXIT_OK, EXIT_VIOLATION, EXIT_INVALID, EXIT_UNKNOWN = 0, 1, 2, 3
PERCENTILES: Final = (50, 90, 99)


@dataclass
class CheckVerdict:
    """One check over all objects."""

    name: str
    objects: int = 0
    ops: int = 0
    steps: int = 0
    ms: float = 0.0
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def verdict(self) -> str:
        for verdict in (INVALID, VIOLATION, UNKNOWN):
            if self.counts.get(verdict):
                return verdict
        return PASS if self.objects else "not exercised"


@dataclass
class Outcome:
    """Everything ``consensus check`` reports."""

    engine: str
    seconds: float = 0.0
    checks: dict[str, CheckVerdict] = field(default_factory=dict)
    findings: list[dict[str, Any]] = field(default_factory=list)
    #: Per operation: its latencies (ns), merged from every bucket's histogram.
    latencies: dict[str, Histogram] = field(default_factory=dict)
    handovers: dict[str, list[int]] = field(default_factory=dict)
    faults: dict[str, int] = field(default_factory=dict)
    runs: dict[str, str] = field(default_factory=dict)
    #: Per lock: overlaps allowed because the earlier holder was fenced (``checker.locks``).
    fenced_overlaps: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_rows(cls, rows: list[dict[str, Any]], engine: str) -> Outcome:
        """Merge the per-bucket output rows."""
        outcome = cls(engine, checks={name: CheckVerdict(name) for name in ALL_CHECKS})
        for row in rows:
            check, verdict, key = row["check"], row["verdict"], row["key"]
            if verdict == SUMMARY:
                total = outcome.checks.setdefault(check, CheckVerdict(check))
                total.objects += row["objects"]
                total.ops += row["ops"]
                total.steps += row["steps"]
                total.ms += row["ms"]
            elif verdict == STAT:
                values = row["values"] or []
                if check == LATENCY:
                    outcome.latencies.setdefault(key, Histogram()).merge(values)
                elif check == "handover":
                    outcome.handovers.setdefault(key, []).extend(values)
                elif check == "fault":
                    outcome.faults[key] = outcome.faults.get(key, 0) + len(values)
                elif check == "fenced-overlap":
                    outcome.fenced_overlaps[key] = outcome.fenced_overlaps.get(key, 0) + len(values)
            else:
                counts = outcome.checks.setdefault(check, CheckVerdict(check)).counts
                counts[verdict] = counts.get(verdict, 0) + 1
                outcome.findings.append({**row, "detail": json.loads(row["detail"] or "{}")})
        outcome.findings.sort(
            key=lambda f: ([INVALID, VIOLATION, UNKNOWN].index(f["verdict"]), f["check"], f["key"])
        )
        return outcome

    @property
    def exit_code(self) -> int:
        verdicts = {check.verdict for check in self.checks.values()}
        if INVALID in verdicts:
            return EXIT_INVALID
        if VIOLATION in verdicts:
            return EXIT_VIOLATION
        return EXIT_UNKNOWN if UNKNOWN in verdicts else EXIT_OK

    def latency_table(self) -> dict[str, dict[str, float]]:
        """Per operation: count and latency percentiles in milliseconds (within 1/64 below; max exact)."""
        table = {}
        for f, histogram in sorted(self.latencies.items()):
            if not histogram.count:
                continue
            row = {"count": float(histogram.count)}
            for p in PERCENTILES:
                row[f"p{p}"] = histogram.percentile(p) / 1e6
            row["max"] = histogram.maximum / 1e6
            table[f] = row
        return table

    def handover_table(self) -> dict[str, list[float]]:
        """Per service: the leader handover gaps in seconds."""
        return {
            service: [gap / 1e9 for gap in gaps] for service, gaps in sorted(self.handovers.items()) if gaps
        }

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready summary (findings without their timelines' bulk trimmed)."""
        return {
            "exit_code": self.exit_code,
            "engine": self.engine,
            "seconds": round(self.seconds, 3),
            "runs": self.runs,
            "checks": {
                name: {"verdict": c.verdict, "objects": c.objects, "ops": c.ops, "steps": c.steps, **c.counts}
                for name, c in self.checks.items()
            },
            "findings": [
                {
                    "check": f["check"],
                    "run": f["run"],
                    "key": f["key"],
                    "verdict": f["verdict"],
                    "message": f["detail"].get("message", ""),
                    "slice": f["detail"].get("timeline", []),
                }
                for f in self.findings
            ],
            "latency_ms": self.latency_table(),
            "handover_s": self.handover_table(),
            "faults": self.faults,
            "fenced_overlaps": self.fenced_overlaps,
        }
