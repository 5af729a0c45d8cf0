"""The ``sqlite`` store of ``consensus servers run``: no server, a fresh database file in a temp dir."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from types import TracebackType
from typing import Self


class DatabaseFile:
    """A fresh SQLite database file in its own temp dir (inside ``workdir`` when given); ``stop``
    deletes it. There is no process: no control file, nothing to kill or pause."""

    def __init__(self, workdir: Path | None = None) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="consensus-sqlite-", dir=workdir))
        self.url = f"sqlite:///{self.directory / 'consensus.db'}"

    def stop(self) -> None:
        """Delete the database file and its directory."""
        shutil.rmtree(self.directory, ignore_errors=True)

    def write_control(self, path: Path) -> None:
        """A database file has no process to control: no control file."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()
