"""Errors: versions, fences and coordinator timeouts out of range are refused
before the backend is called.

Contract: sections 4, 8 of <https://consensus-api.github.io/consensus-api/spec/>
"""

from __future__ import annotations

from typing import Any

import pytest

from consensus_api import ConfigurationError, InvalidKeyError, InvalidTypeError, Leadership, Session
from consensus_testkit.conformance.coordination import RecordingHandler
from consensus_testkit.conformance.helpers import unique


@pytest.mark.parametrize("version", [-1, 2**63, 10**30])
def test_version_out_of_range_raises(
    consensus_shared_session: Session, consensus_ns: str, version: int
) -> None:
    """A version below 0 or above 2**63-1 raises InvalidKeyError before the backend is called."""
    consensus_shared_session.storage.put(f"{consensus_ns}/k", b"v")
    with pytest.raises(InvalidKeyError, match="version"):
        consensus_shared_session.storage.update(f"{consensus_ns}/k", b"w", version=version)
    with pytest.raises(InvalidKeyError, match="version"):
        consensus_shared_session.storage.delete(f"{consensus_ns}/k", version=version)
    fetched = consensus_shared_session.storage.fetch(f"{consensus_ns}/k")
    assert fetched is not None and fetched.value == b"v"


BAD_LEADERSHIPS = {
    "term str": (Leadership("s", "c", "1"), InvalidTypeError),  # type: ignore[arg-type]
    "term float": (Leadership("s", "c", 1.0), InvalidTypeError),  # type: ignore[arg-type]
    "term bool": (Leadership("s", "c", True), InvalidTypeError),
    "term negative": (Leadership("s", "c", -1), InvalidKeyError),
    "term over 2**63-1": (Leadership("s", "c", 2**63), InvalidKeyError),
    "leader id int": (Leadership("s", 7, 1), InvalidTypeError),  # type: ignore[arg-type]
    "leader id with slash": (Leadership("s", "a/b", 1), InvalidKeyError),
    "service empty": (Leadership("", "c", 1), InvalidKeyError),
}


@pytest.mark.parametrize("case", sorted(BAD_LEADERSHIPS))
def test_bad_fence_fields_raise(consensus_shared_session: Session, consensus_ns: str, case: str) -> None:
    """A Leadership whose service, leader id or term is malformed raises before the backend is called."""
    fence, error = BAD_LEADERSHIPS[case]
    storage = consensus_shared_session.storage
    with pytest.raises(error, match="fence"):
        storage.put(f"{consensus_ns}/k", b"v", fence=fence)
    storage.put(f"{consensus_ns}/k", b"v")
    with pytest.raises(error, match="fence"):
        storage.update(f"{consensus_ns}/k", b"w", fence=fence)
    with pytest.raises(error, match="fence"):
        storage.delete(f"{consensus_ns}/k", fence=fence)
    fetched = storage.fetch(f"{consensus_ns}/k")
    assert fetched is not None and fetched.value == b"v"


@pytest.mark.parametrize("seconds", [float("nan"), float("inf"), 0, -1, 1e12, "5", True])
def test_bad_coordinator_timeouts_raise_configuration_error(
    consensus_shared_session: Session, seconds: Any
) -> None:
    """rebalance_timeout and ensure_active_group(timeout=) outside 0.01 s to one day raise
    ConfigurationError, naming the argument, before the coordinator joins anything."""
    group = unique("ct-group")
    with pytest.raises(ConfigurationError, match=r"^rebalance_timeout: "):
        consensus_shared_session.coordinator(group, "t", RecordingHandler(), rebalance_timeout=seconds)
    with pytest.raises(ConfigurationError, match=r"^rebalance_timeout: "):
        consensus_shared_session.incremental_coordinator(group, ["r"], print, rebalance_timeout=seconds)  # type: ignore[arg-type]
    coordinator = consensus_shared_session.coordinator(group, "t", RecordingHandler())
    try:
        with pytest.raises(ConfigurationError, match=r"^timeout: "):
            coordinator.ensure_active_group(seconds)
    finally:
        coordinator.close()
