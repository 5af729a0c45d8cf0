"""``with`` support for the objects whose ``close`` releases everything they hold."""

from __future__ import annotations

from abc import ABC, abstractmethod
from types import TracebackType
from typing import Self


class Closing(ABC):
    """A context manager: ``with`` gives the object itself and calls ``close`` on exit, also when
    the block raises (the exception then propagates)."""

    @abstractmethod
    def close(self) -> None:
        """Release everything held; idempotent."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
