"""Versioned, linearizable key-value storage.

Contract: <https://consensus-api.github.io/consensus-api/spec/#4-storage-kip-30-storage>
"""

from __future__ import annotations

import itertools

import pytest

from consensus_api import KeyExistsError, KeyNotFoundError, Session, VersionConflictError, Versioned
from consensus_testkit.conformance.helpers import SessionFactory, unique

MIB = 1024 * 1024


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def test_fetch_missing_key_returns_none(consensus_session: Session, consensus_ns: str) -> None:
    """fetch of a key that was never written returns None."""
    assert consensus_session.storage.fetch(f"{consensus_ns}/missing") is None


def test_put_returns_version_and_fetch_returns_it(consensus_session: Session, consensus_ns: str) -> None:
    """put returns an int version; fetch returns Versioned(value, that version) with bytes."""
    version = consensus_session.storage.put(f"{consensus_ns}/k", b"one")
    assert _is_int(version)
    fetched = consensus_session.storage.fetch(f"{consensus_ns}/k")
    assert fetched == Versioned(b"one", version)
    assert fetched is not None and type(fetched.value) is bytes


def test_put_existing_key_raises_key_exists(consensus_session: Session, consensus_ns: str) -> None:
    """A second put of a key raises KeyExistsError and leaves value and version alone."""
    version = consensus_session.storage.put(f"{consensus_ns}/k", b"first")
    with pytest.raises(KeyExistsError):
        consensus_session.storage.put(f"{consensus_ns}/k", b"second")
    assert consensus_session.storage.fetch(f"{consensus_ns}/k") == Versioned(b"first", version)


def test_update_without_version_replaces_value(consensus_session: Session, consensus_ns: str) -> None:
    """update without version replaces the value and returns a higher version."""
    first = consensus_session.storage.put(f"{consensus_ns}/k", b"one")
    second = consensus_session.storage.update(f"{consensus_ns}/k", b"two")
    assert _is_int(second) and second > first
    assert consensus_session.storage.fetch(f"{consensus_ns}/k") == Versioned(b"two", second)


def test_update_with_current_version_succeeds(consensus_session: Session, consensus_ns: str) -> None:
    """update with the current version succeeds and returns a higher version."""
    first = consensus_session.storage.put(f"{consensus_ns}/k", b"one")
    second = consensus_session.storage.update(f"{consensus_ns}/k", b"two", version=first)
    assert second > first
    assert consensus_session.storage.fetch(f"{consensus_ns}/k") == Versioned(b"two", second)


def test_update_with_stale_version_conflicts(consensus_session: Session, consensus_ns: str) -> None:
    """update with an old or never-issued version raises VersionConflictError and changes nothing."""
    first = consensus_session.storage.put(f"{consensus_ns}/k", b"one")
    second = consensus_session.storage.update(f"{consensus_ns}/k", b"two")
    with pytest.raises(VersionConflictError):
        consensus_session.storage.update(f"{consensus_ns}/k", b"stale", version=first)
    with pytest.raises(VersionConflictError):
        consensus_session.storage.update(f"{consensus_ns}/k", b"future", version=second + 1000)
    assert consensus_session.storage.fetch(f"{consensus_ns}/k") == Versioned(b"two", second)


def test_update_missing_key_raises_key_not_found(consensus_session: Session, consensus_ns: str) -> None:
    """update of a missing key raises KeyNotFoundError, with and without version, and creates nothing."""
    with pytest.raises(KeyNotFoundError):
        consensus_session.storage.update(f"{consensus_ns}/missing", b"x")
    with pytest.raises(KeyNotFoundError):
        consensus_session.storage.update(f"{consensus_ns}/missing", b"x", version=1)
    assert consensus_session.storage.fetch(f"{consensus_ns}/missing") is None


def test_delete_without_version_removes_key(consensus_session: Session, consensus_ns: str) -> None:
    """delete without version removes the key and returns None."""
    consensus_session.storage.put(f"{consensus_ns}/k", b"v")
    assert consensus_session.storage.delete(f"{consensus_ns}/k") is None  # type: ignore[func-returns-value]
    assert consensus_session.storage.fetch(f"{consensus_ns}/k") is None


def test_delete_with_current_version_removes_key(consensus_session: Session, consensus_ns: str) -> None:
    """delete with the current version removes the key."""
    consensus_session.storage.put(f"{consensus_ns}/k", b"v")
    current = consensus_session.storage.update(f"{consensus_ns}/k", b"w")
    consensus_session.storage.delete(f"{consensus_ns}/k", version=current)
    assert consensus_session.storage.fetch(f"{consensus_ns}/k") is None


def test_delete_with_stale_version_conflicts(consensus_session: Session, consensus_ns: str) -> None:
    """delete with a stale version raises VersionConflictError and keeps the key."""
    first = consensus_session.storage.put(f"{consensus_ns}/k", b"v")
    second = consensus_session.storage.update(f"{consensus_ns}/k", b"w")
    with pytest.raises(VersionConflictError):
        consensus_session.storage.delete(f"{consensus_ns}/k", version=first)
    assert consensus_session.storage.fetch(f"{consensus_ns}/k") == Versioned(b"w", second)


def test_delete_missing_key_raises_key_not_found(consensus_session: Session, consensus_ns: str) -> None:
    """delete of a missing key raises KeyNotFoundError, with and without version."""
    with pytest.raises(KeyNotFoundError):
        consensus_session.storage.delete(f"{consensus_ns}/missing")
    with pytest.raises(KeyNotFoundError):
        consensus_session.storage.delete(f"{consensus_ns}/missing", version=1)
    consensus_session.storage.put(f"{consensus_ns}/gone", b"v")
    consensus_session.storage.delete(f"{consensus_ns}/gone")
    with pytest.raises(KeyNotFoundError):
        consensus_session.storage.delete(f"{consensus_ns}/gone")


def test_versions_strictly_increase_across_updates(consensus_session: Session, consensus_ns: str) -> None:
    """Each update returns a version above the previous one, and fetch agrees."""
    versions = [consensus_session.storage.put(f"{consensus_ns}/k", b"0")]
    for number in range(1, 12):
        versions.append(consensus_session.storage.update(f"{consensus_ns}/k", str(number).encode()))
        assert consensus_session.storage.fetch(f"{consensus_ns}/k") == Versioned(
            str(number).encode(), versions[-1]
        )
    assert all(later > earlier for earlier, later in itertools.pairwise(versions))


def test_versions_strictly_increase_across_delete_and_recreate(
    consensus_session: Session, consensus_ns: str
) -> None:
    """A re-created key gets a version above every version it had before its delete."""
    highest = consensus_session.storage.put(f"{consensus_ns}/k", b"a")
    for cycle in range(3):
        highest = max(highest, consensus_session.storage.update(f"{consensus_ns}/k", b"b"))
        consensus_session.storage.delete(f"{consensus_ns}/k")
        recreated = consensus_session.storage.put(f"{consensus_ns}/k", f"c{cycle}".encode())
        assert recreated > highest, f"cycle {cycle}: re-created at {recreated} after {highest}"
        highest = recreated


def test_version_from_before_delete_does_not_match_recreated_key(
    consensus_session: Session, consensus_ns: str
) -> None:
    """update/delete with a version of the deleted incarnation conflict with the re-created key (no ABA)."""
    old = consensus_session.storage.put(f"{consensus_ns}/k", b"old")
    consensus_session.storage.delete(f"{consensus_ns}/k")
    new = consensus_session.storage.put(f"{consensus_ns}/k", b"new")
    with pytest.raises(VersionConflictError):
        consensus_session.storage.update(f"{consensus_ns}/k", b"x", version=old)
    with pytest.raises(VersionConflictError):
        consensus_session.storage.delete(f"{consensus_ns}/k", version=old)
    assert consensus_session.storage.fetch(f"{consensus_ns}/k") == Versioned(b"new", new)


def test_keys_lists_exactly_one_level(consensus_session: Session, consensus_ns: str) -> None:
    """keys(ns) after put ns/a, ns/b, ns/sub/c is exactly {ns/a, ns/b}, as a frozenset."""
    for name in ("a", "b", "sub/c"):
        consensus_session.storage.put(f"{consensus_ns}/{name}", b"")
    listed = consensus_session.storage.keys(consensus_ns)
    assert isinstance(listed, frozenset)
    assert listed == {f"{consensus_ns}/a", f"{consensus_ns}/b"}
    assert consensus_session.storage.keys(f"{consensus_ns}/sub") == {f"{consensus_ns}/sub/c"}


def test_intermediate_segments_are_not_keys(consensus_session: Session, consensus_ns: str) -> None:
    """put ns/x/y/z creates no key at ns/x or ns/x/y: fetch is None and keys() skips them."""
    consensus_session.storage.put(f"{consensus_ns}/x/y/z", b"deep")
    assert consensus_session.storage.fetch(f"{consensus_ns}/x") is None
    assert consensus_session.storage.fetch(f"{consensus_ns}/x/y") is None
    assert consensus_session.storage.keys(consensus_ns) == frozenset()
    assert consensus_session.storage.keys(f"{consensus_ns}/x") == frozenset()
    assert consensus_session.storage.keys(f"{consensus_ns}/x/y") == {f"{consensus_ns}/x/y/z"}


def test_key_may_have_value_and_keys_below(consensus_session: Session, consensus_ns: str) -> None:
    """A key can hold a value and have keys below it, in either order of creation."""
    parent = consensus_session.storage.put(f"{consensus_ns}/p", b"parent")
    consensus_session.storage.put(f"{consensus_ns}/p/child", b"child")
    consensus_session.storage.put(f"{consensus_ns}/q/child", b"child first")
    late = consensus_session.storage.put(f"{consensus_ns}/q", b"parent later")
    assert consensus_session.storage.fetch(f"{consensus_ns}/p") == Versioned(b"parent", parent)
    assert consensus_session.storage.fetch(f"{consensus_ns}/q") == Versioned(b"parent later", late)
    assert consensus_session.storage.keys(consensus_ns) == {f"{consensus_ns}/p", f"{consensus_ns}/q"}
    assert consensus_session.storage.keys(f"{consensus_ns}/p") == {f"{consensus_ns}/p/child"}


def test_deleting_child_or_parent_leaves_the_other(consensus_session: Session, consensus_ns: str) -> None:
    """Deleting a child keeps its parent key; deleting a parent key keeps its children."""
    consensus_session.storage.put(f"{consensus_ns}/p", b"parent")
    consensus_session.storage.put(f"{consensus_ns}/p/c1", b"1")
    consensus_session.storage.put(f"{consensus_ns}/p/c2", b"2")
    consensus_session.storage.delete(f"{consensus_ns}/p/c1")
    assert consensus_session.storage.fetch(f"{consensus_ns}/p") is not None
    assert consensus_session.storage.keys(f"{consensus_ns}/p") == {f"{consensus_ns}/p/c2"}
    consensus_session.storage.delete(f"{consensus_ns}/p")
    assert consensus_session.storage.fetch(f"{consensus_ns}/p") is None
    child = consensus_session.storage.fetch(f"{consensus_ns}/p/c2")
    assert child is not None and child.value == b"2"
    assert consensus_session.storage.keys(f"{consensus_ns}/p") == {f"{consensus_ns}/p/c2"}
    assert consensus_session.storage.keys(consensus_ns) == frozenset()


def test_keys_of_missing_namespace_is_empty(consensus_session: Session, consensus_ns: str) -> None:
    """keys() of a namespace with nothing below it is an empty frozenset, also for a plain key."""
    assert consensus_session.storage.keys(f"{consensus_ns}/nothing/here") == frozenset()
    consensus_session.storage.put(f"{consensus_ns}/leaf", b"v")
    assert consensus_session.storage.keys(f"{consensus_ns}/leaf") == frozenset()


def test_keys_of_root_lists_top_level_keys(consensus_session: Session) -> None:
    """keys("") holds a top-level key once it is put, and only single-segment keys."""
    top = unique("ct-top")
    consensus_session.storage.put(top, b"top")
    try:
        listed = consensus_session.storage.keys()
        assert top in listed
        assert all("/" not in key for key in listed), sorted(listed)[:20]
    finally:
        consensus_session.storage.delete(top)
    assert top not in consensus_session.storage.keys("")


def test_binary_values_round_trip(consensus_session: Session, consensus_ns: str) -> None:
    """Every byte value, NULs and invalid UTF-8 included, round-trips unchanged through put and update."""
    every_byte = bytes(range(256)) * 4
    consensus_session.storage.put(f"{consensus_ns}/bin", every_byte)
    fetched = consensus_session.storage.fetch(f"{consensus_ns}/bin")
    assert fetched is not None and fetched.value == every_byte
    tricky = b"\x00\xff\xfe\x80\xc3\x28\x00"
    consensus_session.storage.update(f"{consensus_ns}/bin", tricky)
    fetched = consensus_session.storage.fetch(f"{consensus_ns}/bin")
    assert fetched is not None and fetched.value == tricky


def test_empty_value_is_not_a_missing_key(consensus_session: Session, consensus_ns: str) -> None:
    """b"" is a value: put and update of b"" fetch back as b"", not None."""
    first = consensus_session.storage.put(f"{consensus_ns}/empty", b"")
    assert consensus_session.storage.fetch(f"{consensus_ns}/empty") == Versioned(b"", first)
    consensus_session.storage.put(f"{consensus_ns}/later", b"x")
    second = consensus_session.storage.update(f"{consensus_ns}/later", b"")
    assert consensus_session.storage.fetch(f"{consensus_ns}/later") == Versioned(b"", second)


def test_one_mebibyte_value_round_trips(consensus_session: Session, consensus_ns: str) -> None:
    """A value of exactly 1 MiB round-trips through put and update."""
    big = bytes(range(256)) * (MIB // 256)
    assert len(big) == MIB
    consensus_session.storage.put(f"{consensus_ns}/big", big)
    fetched = consensus_session.storage.fetch(f"{consensus_ns}/big")
    assert fetched is not None and fetched.value == big
    reversed_big = big[::-1]
    version = consensus_session.storage.update(f"{consensus_ns}/big", reversed_big)
    assert consensus_session.storage.fetch(f"{consensus_ns}/big") == Versioned(reversed_big, version)


def test_unicode_keys(consensus_session: Session, consensus_ns: str) -> None:
    """Keys with non-ASCII segments round-trip through put, fetch, keys and delete."""
    names = ("ключ", "値", "🔑", "ü-ß é")
    for name in names:
        consensus_session.storage.put(f"{consensus_ns}/{name}", name.encode())
    assert consensus_session.storage.keys(consensus_ns) == {f"{consensus_ns}/{name}" for name in names}
    for name in names:
        fetched = consensus_session.storage.fetch(f"{consensus_ns}/{name}")
        assert fetched is not None and fetched.value == name.encode()
    consensus_session.storage.delete(f"{consensus_ns}/🔑")
    assert consensus_session.storage.keys(consensus_ns) == {
        f"{consensus_ns}/{name}" for name in names if name != "🔑"
    }


def test_reads_are_linearizable_across_sessions(
    consensus_open_session: SessionFactory, consensus_ns: str
) -> None:
    """A write completed in one session is seen by the very next fetch in another, every time."""
    first, second = consensus_open_session(), consensus_open_session()
    version = first.storage.put(f"{consensus_ns}/lin", b"0")
    for number in range(1, 41):
        writer, reader = (first, second) if number % 2 else (second, first)
        value = str(number).encode()
        version = writer.storage.update(f"{consensus_ns}/lin", value)
        assert reader.storage.fetch(f"{consensus_ns}/lin") == Versioned(value, version), f"round {number}"
    writer.storage.delete(f"{consensus_ns}/lin")
    assert reader.storage.fetch(f"{consensus_ns}/lin") is None
    writer.storage.put(f"{consensus_ns}/new", b"n")
    assert f"{consensus_ns}/new" in reader.storage.keys(consensus_ns)


def test_walk_yields_every_key_below_at_any_depth(consensus_session: Session, consensus_ns: str) -> None:
    """walk(ns) yields each live key below ns once, at any depth, with its value and version.

    Not ns itself, not deleted keys, not keys of a sibling whose name extends
    ns's (``ns_x``, ``ns%``, ``ns0``); more keys than one page of any backend.
    """
    expected: dict[str, Versioned] = {}
    names = [f"p{number:03d}" for number in range(300)] + ["a_b", "a%b", "d/e", "d/e/f", "x/y/z/w", "ü/🔑"]
    for name in names:
        key, value = f"{consensus_ns}/{name}", name.encode() + b"\x00\xff"
        expected[key] = Versioned(value, consensus_session.storage.put(key, value))
    consensus_session.storage.put(consensus_ns, b"ns itself")
    for sibling in (f"{consensus_ns}_x/k", f"{consensus_ns}%/k", f"{consensus_ns}0/k", f"{consensus_ns}-a"):
        consensus_session.storage.put(sibling, b"outside")
    consensus_session.storage.put(f"{consensus_ns}/gone/k", b"deleted")
    consensus_session.storage.delete(f"{consensus_ns}/gone/k")
    walked = list(consensus_session.storage.walk(consensus_ns))
    assert len(walked) == len({key for key, _ in walked}), "a key was yielded twice"
    assert dict(walked) == expected
    assert all(isinstance(key, str) and type(found.value) is bytes for key, found in walked)
    assert dict(consensus_session.storage.walk(f"{consensus_ns}/d")) == {
        f"{consensus_ns}/d/e": expected[f"{consensus_ns}/d/e"],
        f"{consensus_ns}/d/e/f": expected[f"{consensus_ns}/d/e/f"],
    }
    assert list(consensus_session.storage.walk(f"{consensus_ns}/nothing")) == []
    assert list(consensus_session.storage.walk(f"{consensus_ns}/p000")) == []
