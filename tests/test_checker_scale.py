"""What the scale benchmark relies on: its generated histories, bounded latency histograms, and both
engines agreeing on them (benchmarks/check_scale.py times them; no target is judged here)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from benchmarks import histories
from consensus_api.errors import ConfigurationError
from consensus_chaos.check import check_history
from consensus_chaos.check.histogram import Histogram, bin_floor, bin_of

pytest.importorskip("pyarrow")


def test_histogram_percentiles_are_within_a_64th_below_the_exact_ones() -> None:
    rng = random.Random(3)
    values = [int(rng.lognormvariate(14, 1.5)) for _ in range(20_000)] + [0, 1, 127, 128]
    parts = [Histogram() for _ in range(7)]
    for index, value in enumerate(values):
        parts[index % 7].add_all([value])
    merged = Histogram()
    for part in parts:
        merged.merge(part.encode())
    ordered = sorted(values)
    assert merged.count == len(values)
    assert merged.maximum == ordered[-1]
    for p in (0, 50, 90, 99, 100):
        exact = ordered[min(len(ordered) - 1, len(ordered) * p // 100)]
        assert exact - exact / 64 <= merged.percentile(p) <= exact
    assert all(bin_floor(bin_of(v)) == v for v in range(128))
    assert all(v - v / 64 <= bin_floor(bin_of(v)) <= v for v in range(128, 100_000))
    assert len(merged.encode()) < 2 * 64 * 30  # bins per factor of two, times the factors of two spanned


def test_generated_histories_are_deterministic_whatever_the_workers(tmp_path: Path) -> None:
    one = histories.generate(tmp_path / "one", 30_000, 12_000, seed=5, workers=1)
    two = histories.generate(tmp_path / "two", 30_000, 12_000, seed=5, workers=2)
    assert one == two == 60_000
    names = sorted(p.name for p in (tmp_path / "one").iterdir())
    assert names == ["part-00000.parquet", "part-00001.parquet"]
    for name in names:
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes()
    with pytest.raises(ValueError, match="one operation per key"):
        histories.generate(tmp_path / "bad", 10, 20)


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    pytest.importorskip("pyspark")
    from consensus_chaos.check.spark import spark_session  # noqa: PLC0415

    session = spark_session("local[2]", driver_memory="512m")
    yield session
    session.stop()


def test_both_engines_pass_the_generated_history_and_catch_the_planted_read(
    tmp_path: Path, spark: Any
) -> None:
    histories.generate(tmp_path / "valid", 20_000, 2_000, workers=1)
    histories.generate(tmp_path / "bad", 20_000, 2_000, violation=True, workers=1)
    for name, code, keys in (("valid", 0, []), ("bad", 1, [histories.planted_key(2_000)])):
        local = check_history(tmp_path / name, "local")
        distributed = check_history(tmp_path / name, "spark", session=spark)
        for outcome in (local, distributed):
            assert outcome.exit_code == code
            assert [f["key"] for f in outcome.findings] == keys
            assert outcome.checks["linearizability"].objects == 2_000
        assert distributed.latency_table() == local.latency_table()
        assert local.latency_table()["fetch"]["count"] > 5_000


def test_driver_memory_is_checked_before_anything_starts(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="512m or 2g"):
        check_history(tmp_path, "spark", driver_memory="2 GB")
