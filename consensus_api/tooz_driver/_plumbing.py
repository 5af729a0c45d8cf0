"""What the tooz driver's modules share: URLs, ids, results and error translation."""

from __future__ import annotations

import contextlib
import datetime
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import parse_qsl, urlencode

import tooz
from tooz import coordination, utils

from consensus_api.errors import (
    BackendUnavailableError,
    ConsensusError,
    OperationTimeoutError,
    SessionLostError,
)

if TYPE_CHECKING:
    from consensus_api.session import Session

T = TypeVar("T")

SCHEME_PREFIX = "consensus+"
#: tooz's own options in the URL's query; the others are this API's.
TOOZ_OPTIONS = frozenset({"timeout"})
DEFAULT_TIMEOUT = 30.0
#: Where the tooz groups live: a key per group (its existence), a group and an election per group.
GROUPS = "_tooz/groups"
MEMBERS = "_tooz/members"


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


def group_key(group_id: bytes) -> str:
    """The stored key whose existence is the tooz group's."""
    return f"{GROUPS}/{group_id.hex()}"


def group_name(group_id: bytes) -> str:
    """The group (members) and election (leader) of a tooz group."""
    return f"{MEMBERS}/{group_id.hex()}"


def group_exists(session: Session, group_id: bytes) -> bool:
    """True if the tooz group was created (and not deleted)."""
    return session.storage.fetch(group_key(group_id)) is not None


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
