"""Value and key-set listeners and their four delivery rules.

Contract: <https://consensus-api.github.io/consensus-api/spec/#5-listenerregistry-kip-30-listenerregistry>
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from consensus_api import KeySetChanged, Session, ValueChanged
from consensus_testkit.conformance.helpers import (
    EventLog,
    SessionFactory,
    is_dispatch_thread,
    quiet_period,
    unique,
)


def _versions(log: EventLog[ValueChanged]) -> list[int]:
    return [event.version for event in log.events if event.version is not None]


def _assert_never_back(log: EventLog[ValueChanged]) -> None:
    versions = _versions(log)
    assert versions == sorted(versions), f"versions went back: {versions}"


def _flowing(session: Session) -> Callable[[], None]:
    """The positive control of a negative check: a write to a key of its own reaches a new value
    listener of ``session``."""

    def control() -> None:
        key = f"{unique('ct-control')}/k"
        log: EventLog[ValueChanged] = EventLog("control")
        session.listeners.add_value_listener(key, log)
        log.wait_count(1)
        version = session.storage.put(key, b"control")
        log.wait_for(lambda event: event.version == version, what="the control write")

    return control


def test_value_listener_first_event_reports_existing_value(
    consensus_session: Session, consensus_ns: str
) -> None:
    """The first event after registration on an existing key is its current value and version."""
    version = consensus_session.storage.put(f"{consensus_ns}/k", b"now")
    log: EventLog[ValueChanged] = EventLog("value")
    consensus_session.listeners.add_value_listener(f"{consensus_ns}/k", log)
    assert log.wait_count(1)[0] == ValueChanged(f"{consensus_ns}/k", b"now", version)


def test_value_listener_first_event_reports_missing_key(
    consensus_session: Session, consensus_ns: str
) -> None:
    """The first event after registration on a missing key is ValueChanged(key, None, None)."""
    log: EventLog[ValueChanged] = EventLog("value")
    consensus_session.listeners.add_value_listener(f"{consensus_ns}/absent", log)
    assert log.wait_count(1)[0] == ValueChanged(f"{consensus_ns}/absent", None, None)


def test_second_listener_on_same_key_gets_current_state_first(
    consensus_session: Session, consensus_ns: str
) -> None:
    """A listener added while another already watches the key still gets the current state first."""
    key = f"{consensus_ns}/k"
    first: EventLog[ValueChanged] = EventLog("first")
    consensus_session.listeners.add_value_listener(key, first)
    first.wait_count(1)
    version = consensus_session.storage.put(key, b"v")
    first.wait_for(lambda event: event.version == version)
    second: EventLog[ValueChanged] = EventLog("second")
    consensus_session.listeners.add_value_listener(key, second)
    assert second.wait_count(1)[0] == ValueChanged(key, b"v", version)


def test_value_listener_sees_put_update_delete_in_order(
    consensus_session: Session, consensus_ns: str
) -> None:
    """put, update and delete each reach the listener in order; a delete is value None, version None."""
    key = f"{consensus_ns}/k"
    log: EventLog[ValueChanged] = EventLog("value")
    consensus_session.listeners.add_value_listener(key, log)
    log.wait_count(1)
    created = consensus_session.storage.put(key, b"a")
    log.wait_for(lambda event: event.version == created, what=f"version {created}")
    updated = consensus_session.storage.update(key, b"b")
    log.wait_for(lambda event: event.version == updated, what=f"version {updated}")
    consensus_session.storage.delete(key)
    log.wait_last(lambda event: event.version is None, what="the delete")
    assert log.events == [
        ValueChanged(key, None, None),
        ValueChanged(key, b"a", created),
        ValueChanged(key, b"b", updated),
        ValueChanged(key, None, None),
    ]


def test_value_burst_is_ordered_and_converges(consensus_session: Session, consensus_ns: str) -> None:
    """After a burst of updates, versions never went back and the last event equals the stored state."""
    key = f"{consensus_ns}/burst"
    consensus_session.storage.put(key, b"0")
    log: EventLog[ValueChanged] = EventLog("value")
    consensus_session.listeners.add_value_listener(key, log)
    for number in range(1, 40):
        consensus_session.storage.update(key, str(number).encode())
    stored = consensus_session.storage.fetch(key)
    assert stored is not None
    final = ValueChanged(key, stored.value, stored.version)
    log.wait_last(lambda event: event == final, what=f"convergence to {final}")
    _assert_never_back(log)
    quiet_period(_flowing(consensus_session))
    assert log.events[-1] == final


def test_listener_in_another_session_converges(
    consensus_open_session: SessionFactory, consensus_ns: str
) -> None:
    """Writes by one session reach a listener of another session, in order, ending at the stored state."""
    writer, watcher = consensus_open_session(), consensus_open_session()
    key = f"{consensus_ns}/shared"
    log: EventLog[ValueChanged] = EventLog("remote value")
    watcher.listeners.add_value_listener(key, log)
    log.wait_count(1)
    writer.storage.put(key, b"0")
    for number in range(1, 15):
        writer.storage.update(key, str(number).encode())
    last = writer.storage.update(key, b"last")
    log.wait_last(lambda event: event == ValueChanged(key, b"last", last), what="the last update")
    _assert_never_back(log)
    writer.storage.delete(key)
    log.wait_last(lambda event: event == ValueChanged(key, None, None), what="the delete")


def test_keyset_listener_first_event_reports_current_keys(
    consensus_session: Session, consensus_ns: str
) -> None:
    """The first key-set event is the namespace's current keys, one level only."""
    for name in ("a", "b", "deep/c"):
        consensus_session.storage.put(f"{consensus_ns}/{name}", b"")
    log: EventLog[KeySetChanged] = EventLog("keyset")
    consensus_session.listeners.add_keyset_listener(consensus_ns, log)
    assert log.wait_count(1)[0] == KeySetChanged(
        consensus_ns, frozenset({f"{consensus_ns}/a", f"{consensus_ns}/b"})
    )


def test_keyset_listener_first_event_on_empty_namespace(
    consensus_session: Session, consensus_ns: str
) -> None:
    """The first key-set event of an empty namespace has an empty frozenset."""
    log: EventLog[KeySetChanged] = EventLog("keyset")
    consensus_session.listeners.add_keyset_listener(f"{consensus_ns}/empty", log)
    first = log.wait_count(1)[0]
    assert first == KeySetChanged(f"{consensus_ns}/empty", frozenset())
    assert isinstance(first.keys, frozenset)


def test_keyset_listener_follows_adds_and_removes(
    consensus_open_session: SessionFactory, consensus_ns: str
) -> None:
    """Key-set events follow puts and deletes one level below, and never list deeper keys."""
    writer, watcher = consensus_open_session(), consensus_open_session()
    log: EventLog[KeySetChanged] = EventLog("keyset")
    watcher.listeners.add_keyset_listener(consensus_ns, log)
    log.wait_count(1)
    writer.storage.put(f"{consensus_ns}/a", b"")
    log.wait_last(lambda event: event.keys == {f"{consensus_ns}/a"}, what="{a}")
    writer.storage.put(f"{consensus_ns}/sub/deep", b"")
    writer.storage.put(f"{consensus_ns}/b", b"")
    log.wait_last(lambda event: event.keys == {f"{consensus_ns}/a", f"{consensus_ns}/b"}, what="{a, b}")
    writer.storage.delete(f"{consensus_ns}/a")
    log.wait_last(lambda event: event.keys == {f"{consensus_ns}/b"}, what="{b}")
    assert all(f"{consensus_ns}/sub" not in event.keys for event in log.events), log.events
    assert all(event.namespace == consensus_ns for event in log.events)


def test_keyset_burst_converges(consensus_session: Session, consensus_ns: str) -> None:
    """After a burst of puts and deletes, the last key-set event equals keys()."""
    log: EventLog[KeySetChanged] = EventLog("keyset")
    consensus_session.listeners.add_keyset_listener(consensus_ns, log)
    for number in range(20):
        consensus_session.storage.put(f"{consensus_ns}/k{number}", b"")
    for number in range(0, 20, 3):
        consensus_session.storage.delete(f"{consensus_ns}/k{number}")
    final = KeySetChanged(consensus_ns, consensus_session.storage.keys(consensus_ns))
    assert len(final.keys) == 13
    log.wait_last(lambda event: event == final, what="convergence to keys()")
    quiet_period(_flowing(consensus_session))
    assert log.events[-1] == final


def test_callbacks_run_on_the_dispatcher_thread(consensus_session: Session, consensus_ns: str) -> None:
    """Value and key-set callbacks run on a consensus-dispatch thread, never the caller's thread."""
    values: EventLog[ValueChanged] = EventLog("value")
    keysets: EventLog[KeySetChanged] = EventLog("keyset")
    consensus_session.listeners.add_value_listener(f"{consensus_ns}/k", values)
    consensus_session.listeners.add_keyset_listener(consensus_ns, keysets)
    version = consensus_session.storage.put(f"{consensus_ns}/k", b"v")
    values.wait_for(lambda event: event.version == version)
    keysets.wait_for(lambda event: f"{consensus_ns}/k" in event.keys)
    caller = threading.current_thread().name
    for name in values.threads + keysets.threads:
        assert is_dispatch_thread(name), f"callback ran on {name!r}"
        assert name != caller


def test_raising_callback_does_not_stop_delivery(consensus_session: Session, consensus_ns: str) -> None:
    """A callback that raises keeps getting later events, and so do other listeners of the key."""
    key = f"{consensus_ns}/k"
    seen: EventLog[ValueChanged] = EventLog("raising")
    calm: EventLog[ValueChanged] = EventLog("calm")

    def explode(event: ValueChanged) -> None:
        seen(event)
        raise RuntimeError("a callback that raises (raised on purpose by the conformance suite)")

    consensus_session.listeners.add_value_listener(key, explode)
    consensus_session.listeners.add_value_listener(key, calm)
    seen.wait_count(1)
    created = consensus_session.storage.put(key, b"1")
    seen.wait_for(lambda event: event.version == created, what="the put")
    updated = consensus_session.storage.update(key, b"2")
    seen.wait_for(lambda event: event.version == updated, what="the update after a raise")
    calm.wait_for(lambda event: event.version == updated, what="the update")


def test_remove_value_listener_stops_delivery(consensus_session: Session, consensus_ns: str) -> None:
    """After remove_value_listener the callback gets nothing more; other listeners still do."""
    key = f"{consensus_ns}/k"
    removed: EventLog[ValueChanged] = EventLog("removed")
    kept: EventLog[ValueChanged] = EventLog("kept")
    consensus_session.listeners.add_value_listener(key, removed)
    consensus_session.listeners.add_value_listener(key, kept)
    created = consensus_session.storage.put(key, b"1")
    removed.wait_for(lambda event: event.version == created)
    kept.wait_for(lambda event: event.version == created)
    consensus_session.listeners.remove_value_listener(key, removed)
    count = len(removed)
    updated = consensus_session.storage.update(key, b"2")
    kept.wait_for(lambda event: event.version == updated)
    consensus_session.storage.delete(key)
    kept.wait_last(lambda event: event.version is None)
    quiet_period(_flowing(consensus_session))
    assert removed.events[count:] == []


def test_remove_last_listener_stops_delivery(consensus_session: Session, consensus_ns: str) -> None:
    """Removing the only value listener of a key stops its deliveries; re-adding starts afresh."""
    key = f"{consensus_ns}/k"
    log: EventLog[ValueChanged] = EventLog("value")
    consensus_session.listeners.add_value_listener(key, log)
    log.wait_count(1)
    consensus_session.listeners.remove_value_listener(key, log)
    consensus_session.storage.put(key, b"unseen")
    quiet_period(_flowing(consensus_session))
    assert log.events == [ValueChanged(key, None, None)]
    again: EventLog[ValueChanged] = EventLog("again")
    consensus_session.listeners.add_value_listener(key, again)
    assert again.wait_count(1)[0].value == b"unseen"


def test_remove_keyset_listener_stops_delivery(consensus_session: Session, consensus_ns: str) -> None:
    """After remove_keyset_listener the callback gets nothing more; other listeners still do."""
    removed: EventLog[KeySetChanged] = EventLog("removed")
    kept: EventLog[KeySetChanged] = EventLog("kept")
    consensus_session.listeners.add_keyset_listener(consensus_ns, removed)
    consensus_session.listeners.add_keyset_listener(consensus_ns, kept)
    removed.wait_count(1)
    kept.wait_count(1)
    consensus_session.listeners.remove_keyset_listener(consensus_ns, removed)
    count = len(removed)
    consensus_session.storage.put(f"{consensus_ns}/new", b"")
    kept.wait_for(lambda event: f"{consensus_ns}/new" in event.keys)
    quiet_period(_flowing(consensus_session))
    assert removed.events[count:] == []
