"""An ``AsyncStorage`` whose implementation module is imported on a worker thread at its first call.

A backend's asyncio face may need modules that take a tenth of a second and more to import (an
async database driver, its engine): imported by ``Backend.async_storage``, which runs on the event
loop, they would hold the loop that long. ``DeferredAsyncStorage`` keeps ``async_storage`` cheap:
the module is imported by the loop's default executor at the first call, the face built on the loop
right after (once, whatever the number of first calls in flight), and every call is the face's.
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Callable
from types import ModuleType

from consensus_api.backend import AsyncStorage
from consensus_api.model import Leadership, Versioned


class DeferredAsyncStorage:
    """``build(module)`` once ``module_name`` is imported off the loop; then its calls."""

    def __init__(self, module_name: str, build: Callable[[ModuleType], AsyncStorage]) -> None:
        self._module_name = module_name
        self._build = build
        self._face: asyncio.Future[AsyncStorage] | None = None

    async def _ready(self) -> AsyncStorage:
        face = self._face
        if face is None:
            loop = asyncio.get_running_loop()
            face = self._face = loop.create_future()
            try:
                module = await loop.run_in_executor(None, importlib.import_module, self._module_name)
                face.set_result(self._build(module))
            except BaseException as exc:
                self._face = None  # the next call tries again
                if isinstance(exc, asyncio.CancelledError):
                    face.cancel()
                else:
                    face.set_exception(exc)
                    face.exception()  # retrieved here: the caller gets it raised
                raise
        return await asyncio.shield(face)

    async def fetch(self, key: str) -> Versioned | None:
        return await (await self._ready()).fetch(key)

    async def put(self, key: str, value: bytes, fence: Leadership | None) -> int:
        return await (await self._ready()).put(key, value, fence)

    async def update(self, key: str, value: bytes, version: int | None, fence: Leadership | None) -> int:
        return await (await self._ready()).update(key, value, version, fence)

    async def delete(self, key: str, version: int | None, fence: Leadership | None) -> None:
        await (await self._ready()).delete(key, version, fence)

    async def keys(self, namespace: str) -> frozenset[str]:
        return await (await self._ready()).keys(namespace)

    async def aclose(self) -> None:
        face, self._face = self._face, None
        if face is not None and face.done() and face.exception() is None:
            await face.result().aclose()
