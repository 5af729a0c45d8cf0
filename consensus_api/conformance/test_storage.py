"""SPEC section 4: versioned, linearizable key-value storage."""

from __future__ import annotations

import itertools

import pytest

from consensus_api import KeyExistsError, KeyNotFoundError, Session, VersionConflictError, Versioned
from consensus_api.conformance.helpers import SessionFactory, unique

MIB = 1024 * 1024


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def test_fetch_missing_key_returns_none(session: Session, ns: str) -> None:
    """fetch of a key that was never written returns None."""
    assert session.storage.fetch(f"{ns}/missing") is None


def test_put_returns_version_and_fetch_returns_it(session: Session, ns: str) -> None:
    """put returns an int version; fetch returns Versioned(value, that version) with bytes."""
    version = session.storage.put(f"{ns}/k", b"one")
    assert _is_int(version)
    fetched = session.storage.fetch(f"{ns}/k")
    assert fetched == Versioned(b"one", version)
    assert fetched is not None and type(fetched.value) is bytes


def test_put_existing_key_raises_key_exists(session: Session, ns: str) -> None:
    """A second put of a key raises KeyExistsError and leaves value and version alone."""
    version = session.storage.put(f"{ns}/k", b"first")
    with pytest.raises(KeyExistsError):
        session.storage.put(f"{ns}/k", b"second")
    assert session.storage.fetch(f"{ns}/k") == Versioned(b"first", version)


def test_update_without_version_replaces_value(session: Session, ns: str) -> None:
    """update without version replaces the value and returns a higher version."""
    first = session.storage.put(f"{ns}/k", b"one")
    second = session.storage.update(f"{ns}/k", b"two")
    assert _is_int(second) and second > first
    assert session.storage.fetch(f"{ns}/k") == Versioned(b"two", second)


def test_update_with_current_version_succeeds(session: Session, ns: str) -> None:
    """update with the current version succeeds and returns a higher version."""
    first = session.storage.put(f"{ns}/k", b"one")
    second = session.storage.update(f"{ns}/k", b"two", version=first)
    assert second > first
    assert session.storage.fetch(f"{ns}/k") == Versioned(b"two", second)


def test_update_with_stale_version_conflicts(session: Session, ns: str) -> None:
    """update with an old or never-issued version raises VersionConflictError and changes nothing."""
    first = session.storage.put(f"{ns}/k", b"one")
    second = session.storage.update(f"{ns}/k", b"two")
    with pytest.raises(VersionConflictError):
        session.storage.update(f"{ns}/k", b"stale", version=first)
    with pytest.raises(VersionConflictError):
        session.storage.update(f"{ns}/k", b"future", version=second + 1000)
    assert session.storage.fetch(f"{ns}/k") == Versioned(b"two", second)


def test_update_missing_key_raises_key_not_found(session: Session, ns: str) -> None:
    """update of a missing key raises KeyNotFoundError, with and without version, and creates nothing."""
    with pytest.raises(KeyNotFoundError):
        session.storage.update(f"{ns}/missing", b"x")
    with pytest.raises(KeyNotFoundError):
        session.storage.update(f"{ns}/missing", b"x", version=1)
    assert session.storage.fetch(f"{ns}/missing") is None


def test_delete_without_version_removes_key(session: Session, ns: str) -> None:
    """delete without version removes the key and returns None."""
    session.storage.put(f"{ns}/k", b"v")
    assert session.storage.delete(f"{ns}/k") is None  # type: ignore[func-returns-value]
    assert session.storage.fetch(f"{ns}/k") is None


def test_delete_with_current_version_removes_key(session: Session, ns: str) -> None:
    """delete with the current version removes the key."""
    session.storage.put(f"{ns}/k", b"v")
    current = session.storage.update(f"{ns}/k", b"w")
    session.storage.delete(f"{ns}/k", version=current)
    assert session.storage.fetch(f"{ns}/k") is None


def test_delete_with_stale_version_conflicts(session: Session, ns: str) -> None:
    """delete with a stale version raises VersionConflictError and keeps the key."""
    first = session.storage.put(f"{ns}/k", b"v")
    second = session.storage.update(f"{ns}/k", b"w")
    with pytest.raises(VersionConflictError):
        session.storage.delete(f"{ns}/k", version=first)
    assert session.storage.fetch(f"{ns}/k") == Versioned(b"w", second)


def test_delete_missing_key_raises_key_not_found(session: Session, ns: str) -> None:
    """delete of a missing key raises KeyNotFoundError, with and without version."""
    with pytest.raises(KeyNotFoundError):
        session.storage.delete(f"{ns}/missing")
    with pytest.raises(KeyNotFoundError):
        session.storage.delete(f"{ns}/missing", version=1)
    session.storage.put(f"{ns}/gone", b"v")
    session.storage.delete(f"{ns}/gone")
    with pytest.raises(KeyNotFoundError):
        session.storage.delete(f"{ns}/gone")


def test_versions_strictly_increase_across_updates(session: Session, ns: str) -> None:
    """Each update returns a version above the previous one, and fetch agrees."""
    versions = [session.storage.put(f"{ns}/k", b"0")]
    for number in range(1, 12):
        versions.append(session.storage.update(f"{ns}/k", str(number).encode()))
        assert session.storage.fetch(f"{ns}/k") == Versioned(str(number).encode(), versions[-1])
    assert all(later > earlier for earlier, later in itertools.pairwise(versions))


def test_versions_strictly_increase_across_delete_and_recreate(session: Session, ns: str) -> None:
    """A re-created key gets a version above every version it had before its delete."""
    highest = session.storage.put(f"{ns}/k", b"a")
    for cycle in range(3):
        highest = max(highest, session.storage.update(f"{ns}/k", b"b"))
        session.storage.delete(f"{ns}/k")
        recreated = session.storage.put(f"{ns}/k", f"c{cycle}".encode())
        assert recreated > highest, f"cycle {cycle}: re-created at {recreated} after {highest}"
        highest = recreated


def test_version_from_before_delete_does_not_match_recreated_key(session: Session, ns: str) -> None:
    """update/delete with a version of the deleted incarnation conflict with the re-created key (no ABA)."""
    old = session.storage.put(f"{ns}/k", b"old")
    session.storage.delete(f"{ns}/k")
    new = session.storage.put(f"{ns}/k", b"new")
    with pytest.raises(VersionConflictError):
        session.storage.update(f"{ns}/k", b"x", version=old)
    with pytest.raises(VersionConflictError):
        session.storage.delete(f"{ns}/k", version=old)
    assert session.storage.fetch(f"{ns}/k") == Versioned(b"new", new)


def test_keys_lists_exactly_one_level(session: Session, ns: str) -> None:
    """keys(ns) after put ns/a, ns/b, ns/sub/c is exactly {ns/a, ns/b}, as a frozenset."""
    for name in ("a", "b", "sub/c"):
        session.storage.put(f"{ns}/{name}", b"")
    listed = session.storage.keys(ns)
    assert isinstance(listed, frozenset)
    assert listed == {f"{ns}/a", f"{ns}/b"}
    assert session.storage.keys(f"{ns}/sub") == {f"{ns}/sub/c"}


def test_intermediate_segments_are_not_keys(session: Session, ns: str) -> None:
    """put ns/x/y/z creates no key at ns/x or ns/x/y: fetch is None and keys() skips them."""
    session.storage.put(f"{ns}/x/y/z", b"deep")
    assert session.storage.fetch(f"{ns}/x") is None
    assert session.storage.fetch(f"{ns}/x/y") is None
    assert session.storage.keys(ns) == frozenset()
    assert session.storage.keys(f"{ns}/x") == frozenset()
    assert session.storage.keys(f"{ns}/x/y") == {f"{ns}/x/y/z"}


def test_key_may_have_value_and_keys_below(session: Session, ns: str) -> None:
    """A key can hold a value and have keys below it, in either order of creation."""
    parent = session.storage.put(f"{ns}/p", b"parent")
    session.storage.put(f"{ns}/p/child", b"child")
    session.storage.put(f"{ns}/q/child", b"child first")
    late = session.storage.put(f"{ns}/q", b"parent later")
    assert session.storage.fetch(f"{ns}/p") == Versioned(b"parent", parent)
    assert session.storage.fetch(f"{ns}/q") == Versioned(b"parent later", late)
    assert session.storage.keys(ns) == {f"{ns}/p", f"{ns}/q"}
    assert session.storage.keys(f"{ns}/p") == {f"{ns}/p/child"}


def test_deleting_child_or_parent_leaves_the_other(session: Session, ns: str) -> None:
    """Deleting a child keeps its parent key; deleting a parent key keeps its children."""
    session.storage.put(f"{ns}/p", b"parent")
    session.storage.put(f"{ns}/p/c1", b"1")
    session.storage.put(f"{ns}/p/c2", b"2")
    session.storage.delete(f"{ns}/p/c1")
    assert session.storage.fetch(f"{ns}/p") is not None
    assert session.storage.keys(f"{ns}/p") == {f"{ns}/p/c2"}
    session.storage.delete(f"{ns}/p")
    assert session.storage.fetch(f"{ns}/p") is None
    child = session.storage.fetch(f"{ns}/p/c2")
    assert child is not None and child.value == b"2"
    assert session.storage.keys(f"{ns}/p") == {f"{ns}/p/c2"}
    assert session.storage.keys(ns) == frozenset()


def test_keys_of_missing_namespace_is_empty(session: Session, ns: str) -> None:
    """keys() of a namespace with nothing below it is an empty frozenset, also for a plain key."""
    assert session.storage.keys(f"{ns}/nothing/here") == frozenset()
    session.storage.put(f"{ns}/leaf", b"v")
    assert session.storage.keys(f"{ns}/leaf") == frozenset()


def test_keys_of_root_lists_top_level_keys(session: Session) -> None:
    """keys("") holds a top-level key once it is put, and only single-segment keys."""
    top = unique("ct-top")
    session.storage.put(top, b"top")
    try:
        listed = session.storage.keys()
        assert top in listed
        assert all("/" not in key for key in listed), sorted(listed)[:20]
    finally:
        session.storage.delete(top)
    assert top not in session.storage.keys("")


def test_binary_values_round_trip(session: Session, ns: str) -> None:
    """Every byte value, NULs and invalid UTF-8 included, round-trips unchanged through put and update."""
    every_byte = bytes(range(256)) * 4
    session.storage.put(f"{ns}/bin", every_byte)
    fetched = session.storage.fetch(f"{ns}/bin")
    assert fetched is not None and fetched.value == every_byte
    tricky = b"\x00\xff\xfe\x80\xc3\x28\x00"
    session.storage.update(f"{ns}/bin", tricky)
    fetched = session.storage.fetch(f"{ns}/bin")
    assert fetched is not None and fetched.value == tricky


def test_empty_value_is_not_a_missing_key(session: Session, ns: str) -> None:
    """b"" is a value: put and update of b"" fetch back as b"", not None."""
    first = session.storage.put(f"{ns}/empty", b"")
    assert session.storage.fetch(f"{ns}/empty") == Versioned(b"", first)
    session.storage.put(f"{ns}/later", b"x")
    second = session.storage.update(f"{ns}/later", b"")
    assert session.storage.fetch(f"{ns}/later") == Versioned(b"", second)


def test_one_mebibyte_value_round_trips(session: Session, ns: str) -> None:
    """A value of exactly 1 MiB round-trips through put and update."""
    big = bytes(range(256)) * (MIB // 256)
    assert len(big) == MIB
    session.storage.put(f"{ns}/big", big)
    fetched = session.storage.fetch(f"{ns}/big")
    assert fetched is not None and fetched.value == big
    reversed_big = big[::-1]
    version = session.storage.update(f"{ns}/big", reversed_big)
    assert session.storage.fetch(f"{ns}/big") == Versioned(reversed_big, version)


def test_unicode_keys(session: Session, ns: str) -> None:
    """Keys with non-ASCII segments round-trip through put, fetch, keys and delete."""
    names = ("ключ", "値", "🔑", "ü-ß é")
    for name in names:
        session.storage.put(f"{ns}/{name}", name.encode())
    assert session.storage.keys(ns) == {f"{ns}/{name}" for name in names}
    for name in names:
        fetched = session.storage.fetch(f"{ns}/{name}")
        assert fetched is not None and fetched.value == name.encode()
    session.storage.delete(f"{ns}/🔑")
    assert session.storage.keys(ns) == {f"{ns}/{name}" for name in names if name != "🔑"}


def test_reads_are_linearizable_across_sessions(open_session: SessionFactory, ns: str) -> None:
    """A write completed in one session is seen by the very next fetch in another, every time."""
    first, second = open_session(), open_session()
    version = first.storage.put(f"{ns}/lin", b"0")
    for number in range(1, 41):
        writer, reader = (first, second) if number % 2 else (second, first)
        value = str(number).encode()
        version = writer.storage.update(f"{ns}/lin", value)
        assert reader.storage.fetch(f"{ns}/lin") == Versioned(value, version), f"round {number}"
    writer.storage.delete(f"{ns}/lin")
    assert reader.storage.fetch(f"{ns}/lin") is None
    writer.storage.put(f"{ns}/new", b"n")
    assert f"{ns}/new" in reader.storage.keys(ns)


def test_walk_yields_every_key_below_at_any_depth(session: Session, ns: str) -> None:
    """walk(ns) yields each live key below ns once, at any depth, with its value and version.

    Not ns itself, not deleted keys, not keys of a sibling whose name extends
    ns's (``ns_x``, ``ns%``, ``ns0``); more keys than one page of any backend.
    """
    expected: dict[str, Versioned] = {}
    names = [f"p{number:03d}" for number in range(300)] + ["a_b", "a%b", "d/e", "d/e/f", "x/y/z/w", "ü/🔑"]
    for name in names:
        key, value = f"{ns}/{name}", name.encode() + b"\x00\xff"
        expected[key] = Versioned(value, session.storage.put(key, value))
    session.storage.put(ns, b"ns itself")
    for sibling in (f"{ns}_x/k", f"{ns}%/k", f"{ns}0/k", f"{ns}-a"):
        session.storage.put(sibling, b"outside")
    session.storage.put(f"{ns}/gone/k", b"deleted")
    session.storage.delete(f"{ns}/gone/k")
    walked = list(session.storage.walk(ns))
    assert len(walked) == len({key for key, _ in walked}), "a key was yielded twice"
    assert dict(walked) == expected
    assert all(isinstance(key, str) and type(found.value) is bytes for key, found in walked)
    assert dict(session.storage.walk(f"{ns}/d")) == {
        f"{ns}/d/e": expected[f"{ns}/d/e"],
        f"{ns}/d/e/f": expected[f"{ns}/d/e/f"],
    }
    assert list(session.storage.walk(f"{ns}/nothing")) == []
    assert list(session.storage.walk(f"{ns}/p000")) == []
