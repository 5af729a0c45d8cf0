"""What the tooz driver's modules share: URLs, ids, results and error translation."""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import Iterator
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlencode

import tooz
from tooz import coordination, utils

from consensus_api.errors import (
    BackendUnavailableError,
    ConsensusError,
    OperationTimeoutError,
    SessionLostError,
)

T = TypeVar("T")

SCHEME_PREFIX = "consensus+"
#: tooz's own options in the URL's query; the others are this API's.
TOOZ_OPTIONS = frozenset({"timeout"})
DEFAULT_TIMEOUT = 30.0


def backend_url(parsed_url: Any) -> str:
    """This API's URL in a tooz URL (``consensus+<URL>``), without tooz's options."""
    scheme = parsed_url.scheme.removeprefix(SCHEME_PREFIX)
    query = urlencode(
        [(k, v) for k, v in parse_qsl(parsed_url.query, keep_blank_values=True) if k not in TOOZ_OPTIONS]
    )
    return f"{scheme}://{parsed_url.netloc}{parsed_url.path}" + (f"?{query}" if query else "")


def as_bytes(value: bytes | str) -> bytes:
    """tooz ids are bytes; str ones are taken as UTF-8."""
    return value.encode() if isinstance(value, str) else value


def now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat()


class Result(coordination.CoordAsyncResult[T]):
    """A call already made: its value, or the tooz error it raised (at ``get``)."""

    def __init__(self, value: T | None, error: tooz.ToozError | None) -> None:
        self._value, self._error = value, error

    def get(self, timeout: float | None = None) -> T:
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]

    def done(self) -> bool:
        return True


@contextlib.contextmanager
def translated() -> Iterator[None]:
    """Raise this API's errors as tooz's: connection, timeout, or ``ToozError``."""
    try:
        yield
    except (SessionLostError, BackendUnavailableError) as exc:
        utils.raise_with_cause(coordination.ToozConnectionError, str(exc), cause=exc)
    except OperationTimeoutError as exc:
        utils.raise_with_cause(coordination.OperationTimedOut, str(exc), cause=exc)
    except ConsensusError as exc:
        utils.raise_with_cause(tooz.ToozError, str(exc), cause=exc)
