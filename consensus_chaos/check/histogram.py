"""Latency histograms of bounded size, so the checker's output never grows with the history.

Values (nanoseconds, ≥ 0) fall in log-linear bins of ``SIGNIFICANT_BITS``
significant bits: values below ``2**SIGNIFICANT_BITS`` are exact, larger ones
are rounded down by less than 1/64 of their value. A histogram of any number
of values holds at most a few hundred bins per factor of 1,000, and its count
and maximum are exact. Encoded as a flat list of integers
``[max, bin, count, bin, count, ...]`` (one ``array<bigint>`` cell);
histograms merge by adding counts, so per-bucket histograms combine into the
same result whatever the bucketing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

SIGNIFICANT_BITS = 7


def bin_of(value: int) -> int:
    """The bin of ``value`` (≥ 0)."""
    shift = max(0, value.bit_length() - SIGNIFICANT_BITS)
    return (shift << SIGNIFICANT_BITS) | (value >> shift)


def bin_floor(index: int) -> int:
    """The smallest value of bin ``index``."""
    return (index & ((1 << SIGNIFICANT_BITS) - 1)) << (index >> SIGNIFICANT_BITS)


@dataclass
class Histogram:
    """Counts per bin, the exact count and maximum."""

    bins: Counter[int] = field(default_factory=Counter)
    maximum: int = 0

    def add_all(self, values: Iterable[int]) -> None:
        """Count ``values``."""
        for value in values:
            self.bins[bin_of(value)] += 1
            self.maximum = max(self.maximum, value)

    def encode(self) -> list[int]:
        """``[max, bin, count, ...]``."""
        flat = [self.maximum]
        for index, count in sorted(self.bins.items()):
            flat += (index, count)
        return flat

    def merge(self, encoded: Sequence[int]) -> None:
        """Add an encoded histogram's counts."""
        if not encoded:
            return
        self.maximum = max(self.maximum, encoded[0])
        for position in range(1, len(encoded) - 1, 2):
            self.bins[encoded[position]] += encoded[position + 1]

    @property
    def count(self) -> int:
        """How many values were counted."""
        return sum(self.bins.values())

    def percentile(self, p: float) -> int:
        """The floor of the bin holding the value at rank ``count * p // 100`` (as a sorted list's index)."""
        rank = min(self.count - 1, int(self.count * p // 100))
        seen = 0
        for index, count in sorted(self.bins.items()):
            seen += count
            if seen > rank:
                return min(bin_floor(index), self.maximum)
        return self.maximum
