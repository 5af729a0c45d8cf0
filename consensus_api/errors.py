"""The error hierarchy: every failure the API reports is a ``ConsensusError``.

Backends translate their client library's exceptions into these classes, so no
backend exception type ever reaches the application.
"""

from __future__ import annotations


class ConsensusError(Exception):
    """Base class of every error raised by consensus-api."""


class ConfigurationError(ConsensusError):
    """A bad URL, an unknown option, a backend whose extra is not installed, or a connection the
    server refuses for good (credentials, certificates): retrying cannot help."""


class PermissionDeniedError(ConfigurationError):
    """The server admits the session's user but refuses it what the call needs (an ACL, a grant):
    nothing was applied, and retrying cannot help."""


class BackendUnavailableError(ConsensusError):
    """The backend could not be reached within ``connect_timeout``."""


class SessionLostError(ConsensusError):
    """The session's ephemeral state is (or may be) gone, or the session is closed."""


class OperationTimeoutError(ConsensusError):
    """A call did not complete within ``request_timeout``; its effect is unknown, unless
    ``not_applied`` is True: the backend knows the call changed nothing (e.g. it never got the
    database's write lock), so it is safe to retry."""

    def __init__(self, message: str, *, not_applied: bool = False) -> None:
        super().__init__(message)
        self.not_applied = not_applied


class KeyExistsError(ConsensusError):
    """``put`` found the key already present."""


class KeyNotFoundError(ConsensusError):
    """``update`` or ``delete`` found no such key."""


class VersionConflictError(ConsensusError):
    """The key's current version differs from the one the call expected."""


class MemberExistsError(ConsensusError):
    """A live member (or candidate) already has that id."""


class NotAMemberError(ConsensusError):
    """This session holds no membership (or candidacy) with that id."""


class FencedError(ConsensusError):
    """A write fenced by a ``Leadership`` whose term is no longer current."""


class SealedError(ConsensusError):
    """The store was sealed by a migration's cut-over (``consensus migrate cutover``): it accepts no
    write any more, and this one was not applied. Authority moved to the migration's target; connect
    there (or through the bridged URL, which follows the cut-over by itself)."""


class InvalidKeyError(ConsensusError, ValueError):
    """A key, namespace or name breaks the key rules (<https://consensus-api.github.io/consensus-api/spec/#4-storage-kip-30-storage>)."""


class ValueTooLargeError(ConsensusError, ValueError):
    """A value is larger than 1 MiB."""


class InvalidTypeError(ConsensusError, TypeError):
    """An argument has the wrong type (a key that is not ``str``, a value that is not ``bytes``)."""


class InconsistentGroupProtocolError(ConsensusError):
    """A coordinator shares no protocol (or protocol type) with the members of its group.

    Raised to the joiner only; the group it tried to join is not disturbed.
    """
