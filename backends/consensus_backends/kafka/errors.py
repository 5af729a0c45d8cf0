"""Translation of kafka-python exceptions into ``consensus_api.errors``.

Messages name the exception class and what was being done, never a
configuration value, so credentials cannot leak through them.
"""

from __future__ import annotations

import kafka.errors as kerrors

from consensus_api.errors import (
    BackendUnavailableError,
    ConfigurationError,
    ConsensusError,
    OperationTimeoutError,
    PermissionDeniedError,
)

#: Refused logins (the broker's ACL refusals are ``kerrors.AuthorizationError``s).
_AUTHENTICATION = (
    kerrors.SaslAuthenticationFailedError,
    kerrors.UnsupportedSaslMechanismError,
    kerrors.IllegalSaslStateError,
)


def timeout_error(what: str) -> OperationTimeoutError:
    """The error for a call that ran out of time."""
    return OperationTimeoutError(f"Kafka did not answer in time while waiting for {what}")


def translate(exc: BaseException, what: str) -> ConsensusError:
    """The ``ConsensusError`` to raise for ``exc``, raised while doing ``what``."""
    if isinstance(exc, ConsensusError):
        return exc
    name = type(exc).__name__
    if isinstance(exc, kerrors.AuthorizationError):
        return PermissionDeniedError(f"Kafka refused {what}: {name} (check the ACLs)")
    if isinstance(exc, _AUTHENTICATION):
        return ConfigurationError(f"Kafka refused {what}: {name} (check the credentials)")
    if isinstance(exc, kerrors.InvalidSessionTimeoutError):
        return ConfigurationError(
            "the broker refused session_timeout: it must lie within the broker's "
            "group.min.session.timeout.ms and group.max.session.timeout.ms"
        )
    if isinstance(exc, kerrors.InconsistentGroupProtocolError):
        return ConsensusError(f"{what}: the Kafka group is used by another protocol (not consensus-api)")
    if isinstance(exc, kerrors.RetriableError | kerrors.KafkaConnectionError | OSError):
        return OperationTimeoutError(f"Kafka did not complete {what} in time ({name})")
    return ConsensusError(f"Kafka failed {what}: {name}")


def unavailable(exc: BaseException, url: str) -> ConsensusError:
    """The error for a failed ``open``; ``url`` must already be redacted. A refusal (authentication,
    authorization, certificate) is a ``ConfigurationError``: retrying cannot help."""
    if isinstance(exc, ConfigurationError):
        return exc
    if isinstance(exc, kerrors.SaslAuthenticationFailedError):
        return ConfigurationError(
            f"Kafka at {url} refused the login: authentication failed ({type(exc).__name__})"
        )
    if isinstance(exc, kerrors.UnsupportedSaslMechanismError | kerrors.IllegalSaslStateError):
        return ConfigurationError(
            f"Kafka at {url} refused the SASL login: {type(exc).__name__} "
            "(check that the listener offers SASL with this sasl_mechanism)"
        )
    if isinstance(exc, kerrors.AuthorizationError):
        return PermissionDeniedError(
            f"Kafka at {url} refused the connection: {type(exc).__name__} (check the ACLs)"
        )
    return BackendUnavailableError(
        f"could not reach Kafka at {url} within connect_timeout ({type(exc).__name__})"
    )
