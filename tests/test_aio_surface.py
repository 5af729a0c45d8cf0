"""aio follows the synchronous API: every public method of every synchronous recipe has its aio twin.

The recipes are found by introspection (the classes ``consensus_api`` exports that
are neither errors, values, enums, protocols nor abstract), their twins by their
base (``Twin[Lock]``), and every public name of a recipe is held to the rules of
``consensus_api.aio._twin``: same name, parameters and types (a recipe's twin for
the recipe, an async protocol for a protocol); ``async def`` where the
synchronous method may block, and a plain method only where it does no I/O; an
``EventStream`` for each ``add_*listener`` / ``remove_*listener`` pair; ``async
with`` for ``with``; the same attributes with the same values.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import inspect
import re
import typing
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, get_args, get_origin, get_type_hints

import pytest

import consensus_api as ca
from consensus_api import aio
from consensus_api.aio._twin import Twin
from consensus_api.coordinator.engine import EngineHost
from consensus_api.errors import SessionLostError

LISTENER = re.compile(r"(add|remove)_(\w+_)?listener")
#: What the synchronous and the aio types in signatures are named by, wherever they were imported.
NAMES = {
    **{name: getattr(ca, name) for name in ca.__all__},
    **{name: getattr(aio, name) for name in aio.__all__},
}


def _public(cls: type) -> set[str]:
    return {name for name in dir(cls) if not name.startswith("_")} | (
        {"__enter__", "__exit__"} & set(dir(cls))
    )


#: Public names that are not the application's API, so have no twin, and why.
NOT_USER_API: dict[type, dict[str, str]] = {
    ca.Storage: dict.fromkeys(
        ("fetch_nowait", "keys_nowait", "put_nowait", "update_nowait", "delete_nowait"),
        "the no-wait path aio's own storage calls take on the loop",
    )
    | dict.fromkeys(("can_read_nowait", "can_write_nowait"), "which path aio's storage calls take"),
    ca.Coordinator: dict.fromkeys(_public(EngineHost), "the interface the engine calls")
    | {"session_port": "for the coordinator package's own readers"},
    ca.ResourceHandler: dict.fromkeys(_public(ca.CoordinatorHandler), "callbacks its coordinator calls"),
}


def _is_recipe(cls: type) -> bool:
    return not (
        issubclass(cls, BaseException | enum.Enum | tuple)
        or dataclasses.is_dataclass(cls)
        or getattr(cls, "_is_protocol", False)
        or inspect.isabstract(cls)
    )


RECIPES = [obj for name in ca.__all__ if isinstance(obj := getattr(ca, name), type) and _is_recipe(obj)]


def _twins() -> dict[type, type]:
    """Each synchronous recipe and the aio class declared its twin (``Twin[Recipe]``)."""
    twins: dict[type, type] = {}
    for name in aio.__all__:
        cls = getattr(aio, name)
        for base in getattr(cls, "__orig_bases__", ()):
            origin = get_origin(base)
            if isinstance(origin, type) and issubclass(origin, Twin):
                twins[get_args(base)[0]] = cls
    return twins


TWINS = _twins()


def _hints(function: Callable[..., Any]) -> dict[str, Any]:
    return get_type_hints(function, localns=NAMES)


def _matches(sync: Any, twin: Any) -> bool:
    """``twin`` (an aio annotation) stands for ``sync``: equal, the twin of a recipe, an async protocol
    of a protocol (same members) or a recipe's twin satisfying it, or made of such parts."""
    if sync == twin or TWINS.get(sync) is twin:
        return True
    if isinstance(sync, type) and getattr(sync, "_is_protocol", False) and isinstance(twin, type):
        members = _public(sync)
        if getattr(twin, "_is_protocol", False):
            return members == _public(twin)
        stands_for = next((recipe for recipe, cls in TWINS.items() if cls is twin), None)
        return stands_for is not None and members <= _public(stands_for)
    sync_args, twin_args = get_args(sync), get_args(twin)
    return (
        get_origin(sync) is not None
        and get_origin(sync) == get_origin(twin)
        and len(sync_args) == len(twin_args)
        and all(any(_matches(s, t) for t in twin_args) for s in sync_args)
    )


def _same_signature(sync: Callable[..., Any], twin: Callable[..., Any], where: str) -> list[str]:
    """Same parameters (names, kinds, defaults, types) and result."""
    sync_params = list(inspect.signature(sync).parameters.values())[1:]
    twin_params = list(inspect.signature(twin).parameters.values())[1:]
    shape = [(p.name, p.kind, p.default) for p in sync_params]
    if shape != [(p.name, p.kind, p.default) for p in twin_params]:
        return [f"{where}: parameters {inspect.signature(twin)} differ from {inspect.signature(sync)}"]
    sync_types, twin_types = _hints(sync), _hints(twin)
    problems = [
        f"{where}: parameter {p.name} is {twin_types.get(p.name)}, not {sync_types.get(p.name)}"
        for p in sync_params
        if not _matches(sync_types.get(p.name), twin_types.get(p.name))
    ]
    result, twin_result = sync_types.get("return"), twin_types.get("return")
    iterated = get_origin(result) is Iterator and get_origin(twin_result) is AsyncIterator
    if iterated and not inspect.iscoroutinefunction(twin):  # a plain method, iterated with async for
        result, twin_result = get_args(result)[0], get_args(twin_result)[0]
    if not _matches(result, twin_result):
        problems.append(f"{where}: returns {twin_result}, not {result}")
    return problems


def _stream_problems(sync: Callable[..., Any], twin_cls: type, where: str) -> list[str]:
    """``add_*listener(..., callback)``: a plain method of ``twin_cls`` returning an ``EventStream`` of
    the callback's events, taking the same arguments but the callback."""
    hints = _hints(sync)
    params = list(inspect.signature(sync).parameters.values())[1:]
    (event,) = get_args(hints[params[-1].name])[0]
    for name, member in inspect.getmembers(twin_cls, inspect.isfunction):
        if _hints(member).get("return") == aio.EventStream[event]:  # type: ignore[valid-type]
            twin_params = list(inspect.signature(member).parameters.values())[1:]
            if [(p.name, p.kind) for p in twin_params] != [(p.name, p.kind) for p in params[:-1]]:
                return [f"{where}: {name}{inspect.signature(member)} does not take the arguments of {sync}"]
            return []
    return [f"{where}: no method returning EventStream[{event.__name__}] stands for it"]


def surface_problems(recipe: type, twin_cls: type) -> list[str]:
    """How ``twin_cls`` fails to be the aio twin of ``recipe`` (empty when it is)."""
    problems: list[str] = []
    exempt = NOT_USER_API.get(recipe, {})
    for name in sorted(_public(recipe) - set(exempt)):
        where = f"{twin_cls.__name__} ({recipe.__name__}.{name})"
        member = inspect.getattr_static(recipe, name)
        if isinstance(member, property):
            if not isinstance(inspect.getattr_static(twin_cls, name, None), property):
                problems.append(f"{where}: no property {name}")
        elif LISTENER.fullmatch(name):
            problems += _stream_problems(getattr(recipe, name), twin_cls, where)
        elif name in ("__enter__", "__exit__"):
            if not inspect.iscoroutinefunction(getattr(twin_cls, name.replace("__", "__a", 1), None)):
                problems.append(f"{where}: no async {name.replace('__', '__a', 1)}")
        elif not inspect.isfunction(twin := getattr(twin_cls, name, None)):
            problems.append(f"{where}: no method {name}")
        else:
            problems += _same_signature(getattr(recipe, name), twin, where)
    return problems


def test_every_sync_recipe_has_an_aio_twin() -> None:
    assert RECIPES, "no synchronous recipe found"
    assert [recipe.__name__ for recipe in RECIPES if recipe not in TWINS] == []


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda recipe: recipe.__name__)
def test_every_public_method_has_its_twin(recipe: type) -> None:
    assert surface_problems(recipe, TWINS[recipe]) == []


def _without(cls: type, name: str) -> type:
    namespace = {
        key: value for key, value in vars(cls).items() if key not in (name, "__dict__", "__weakref__")
    }
    return type(cls.__name__, cls.__bases__, namespace)


def test_a_missing_or_drifted_twin_is_reported() -> None:
    """The positive control: a twin that lacks a method, or whose method takes other arguments."""
    assert surface_problems(ca.Lock, _without(aio.AsyncLock, "release")) == [
        "AsyncLock (Lock.release): no method release"
    ]
    assert surface_problems(ca.Session, _without(aio.AsyncSession, "describe_group")) == [
        "AsyncSession (Session.describe_group): no method describe_group"
    ]

    async def join(self: object, member_id: str) -> None: ...

    drifted = type("AsyncGroup", (aio.AsyncGroup,), {"join": join})
    assert [problem.split(":")[0] for problem in surface_problems(ca.GroupMembership, drifted)] == [
        "AsyncGroup (GroupMembership.join)"
    ]
    streamless = _without(aio.AsyncElection, "watch")
    assert surface_problems(ca.LeaderElection, streamless) == [
        f"AsyncElection (LeaderElection.{name}): no method returning EventStream[LeaderChanged] stands for it"
        for name in ("add_listener", "remove_listener")
    ]


class _Handler:
    def metadata(self) -> list[tuple[str, bytes]]:
        return [("p", b"")]

    def on_join_prepare(self, generation: int, member_id: str) -> None: ...

    def perform_assignment(
        self, leader_id: str, protocol: str, members: Mapping[str, bytes]
    ) -> dict[str, bytes]:
        return {}

    def on_join_complete(self, generation: int, member_id: str, protocol: str, assignment: bytes) -> None: ...

    def on_leave_prepare(self) -> None: ...


class _Listener:
    def on_assigned(self, resources: frozenset[str]) -> None: ...

    def on_revoked(self, resources: frozenset[str]) -> None: ...


async def _one_of_each(session: aio.AsyncSession) -> list[Twin[Any]]:
    """An aio object of every kind, on ``session``."""
    return [
        session,
        session.storage,
        session.listeners,
        session.group("g"),
        session.election("e"),
        session.lock("l", shared=True),
        await session.coordinator("c", "t", _Handler()),
        await session.incremental_coordinator("i", ["r"], _Listener()),
        aio.AsyncResourceHandler(["r"], _Listener()),
    ]


#: Arguments for the plain twins, by the type of the parameter.
SAMPLES: dict[Any, object] = {str: "surface", Iterable[str]: ["r"]}


def _plain_twins(twin: Twin[Any]) -> Iterator[tuple[str, Callable[..., Any]]]:
    """The twins of synchronous methods that are called, not awaited (no stream, no async iterator)."""
    recipe = next(recipe for recipe, cls in TWINS.items() if isinstance(twin, cls))
    for name in sorted(_public(recipe) - set(NOT_USER_API.get(recipe, {}))):
        method = getattr(twin, name, None)
        if inspect.ismethod(method) and not inspect.iscoroutinefunction(method):
            returns = _hints(method).get("return")
            if get_origin(returns) not in (AsyncIterator, aio.EventStream):
                yield name, method


def test_attributes_match_and_plain_twins_do_no_io(tmp_path: Path) -> None:
    """Every public attribute of a synchronous object has its twin on the aio one, with the same value
    (or the twin of it); every twin that is not awaited stands for a call that does no I/O: on a
    closed session, whose every I/O raises ``SessionLostError``, it still returns."""

    async def main() -> None:
        session = await aio.connect(f"sqlite:///{tmp_path / 'surface.db'}")
        twins = await _one_of_each(session)
        assert {type(twin) for twin in twins} == set(TWINS.values())
        for twin in twins:
            for name, value in vars(twin._sync).items():
                if name.startswith("_"):
                    continue
                mirrored = getattr(twin, name, None)
                assert mirrored == value or getattr(mirrored, "_sync", None) is value, (twin, name)
        await session.close()
        for twin in twins:
            for name, method in _plain_twins(twin):
                params = inspect.signature(method).parameters.values()
                hints = _hints(method)
                args = [SAMPLES[hints[p.name]] for p in params if p.default is inspect.Parameter.empty]
                try:
                    method(*args)
                except SessionLostError as exc:
                    pytest.fail(f"{type(twin).__name__}.{name} is not awaited but does I/O: {exc}")

    asyncio.run(main())


def test_the_twins_keep_the_sync_docstrings() -> None:
    """A twin built from a synchronous method carries its documentation."""
    assert aio.AsyncLock.acquire.__doc__ == ca.Lock.acquire.__doc__
    assert aio.AsyncSession.describe_group.__doc__ == ca.Session.describe_group.__doc__
    assert typing.get_type_hints(aio.AsyncLock.acquire)["return"] == ca.Lease | None
