"""What the checker's Spark jobs need on a cluster: their own code on the executors, histories at URLs
the executors read, and a clear error when they cannot.

Code: ``ship_code(context)`` adds a zip of ``consensus_api`` and
``consensus_chaos`` (their Python sources, built once per process) to the
SparkContext with ``addPyFile``. Executors put it ahead of their own packages,
so they need only pyspark, pandas and pyarrow: a consensus-api of their own,
of another version or none, is never used.

Histories: ``history_url`` names where the executors read a history: a URL as
given (``file://`` on shared storage, ``s3a://``, ``hdfs://``: file systems
whose settings the Spark configuration holds) or a local path as the
``file://`` URL of its absolute path, which on a cluster must name the same
files on every executor's machine. The driver lists the files; it reads no
history row.

Failures: ``readable(url)`` turns Spark's failure to list or read a history
(no such path, a scheme Spark has no file system for, a file an executor
cannot open) into a ``ConfigurationError`` naming the URL and the cause.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import re
import shutil
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import consensus_api
import consensus_chaos
from consensus_api.errors import ConfigurationError

#: The packages whose sources executors get: the checker and the runtime modules it imports.
SHIPPED = (consensus_api, consensus_chaos)
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


@functools.cache
def code_zip() -> Path:
    """The zip of ``SHIPPED``'s Python sources, made once per process in a temporary directory that
    goes when the process exits."""
    directory = Path(tempfile.mkdtemp(prefix="consensus-check-"))
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    archive = directory / f"consensus-check-{consensus_api.__version__}.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zipped:
        for package in SHIPPED:
            root = Path(str(package.__file__)).parent
            for source in sorted(root.rglob("*.py")):
                zipped.write(source, source.relative_to(root.parent))
    return archive


def ship_code(context: Any) -> None:
    """Add ``code_zip()`` to the SparkContext ``context`` unless it holds it already."""
    archive = code_zip()
    if not any(added.endswith(f"/{archive.name}") for added in context.listFiles):
        context.addPyFile(str(archive))


def is_url(location: Path | str) -> bool:
    """Whether ``location`` is a URL (``scheme://...``) rather than a local path."""
    return _URL.match(str(location)) is not None


def history_url(location: Path | str) -> str:
    """The URL Spark reads ``location`` at: a URL as given, a local path as ``file://`` and its absolute
    path (not percent-encoded: Hadoop takes the path as it is)."""
    if is_url(location):
        return str(location).rstrip("/")
    return f"file://{Path(location).resolve()}"


def local_path(location: Path | str) -> Path | None:
    """The local path ``location`` names: a path itself, a ``file://`` URL's path; None for a URL of
    another scheme."""
    if not is_url(location):
        return Path(location)
    parts = urlsplit(str(location))
    return Path(parts.path) if parts.scheme == "file" else None


_UNREADABLE = re.compile(
    r"PATH_NOT_FOUND|FAILED_READ_FILE|FileNotFoundException|AccessDeniedException|AccessControlException"
    r"|InvalidInputException|UnsupportedFileSystemException|No FileSystem for scheme"
    r"|Class org\.apache\.hadoop\.fs\.\S+ not found|ConnectException|UnknownHostException"
)
_JAVA_PREFIX = re.compile(r"^(?:[\w$]+\.)+[\w$]*(?:Exception|Error): ")
#: Where a history must be for the executors of a cluster to read it.
WHERE = (
    "every executor must read it at that URL: a directory on storage each machine mounts at the same "
    "path, or an s3a:// or hdfs:// URL whose file system the Spark configuration sets up"
)


def unreadable_cause(error: BaseException) -> str | None:
    """The line of Spark's ``error`` saying a path could not be listed or read, without Java class
    names; None when ``error`` is about something else."""
    for line in str(error).splitlines():
        if _UNREADABLE.search(line):
            cause = line.strip().lstrip(": ")
            while _JAVA_PREFIX.match(cause):
                cause = _JAVA_PREFIX.sub("", cause, count=1)
            return re.sub(r"\s*SQLSTATE: \w+$", "", cause)[:400]
    return None


@contextlib.contextmanager
def readable(url: str) -> Iterator[None]:
    """Run Spark jobs that read ``url``: their failure to list or read it (on the driver or on an
    executor) is a ``ConfigurationError`` naming the URL, the cause and where a history must be."""
    try:
        yield
    except Exception as error:
        cause = unreadable_cause(error)
        if cause is None:
            raise
        raise ConfigurationError(f"Spark cannot read {url}: {cause}; {WHERE}") from None
