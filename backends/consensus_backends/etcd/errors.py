"""Translating grpc errors into consensus_api errors; no message ever includes credentials."""

from __future__ import annotations

from typing import Any

import grpc

from consensus_api.errors import (
    ConfigurationError,
    ConsensusError,
    OperationTimeoutError,
    PermissionDeniedError,
    SessionLostError,
)

Code = grpc.StatusCode

#: grpc's UNAVAILABLE details when no connection could be made: the request was never sent.
NOT_SENT = "failed to connect to all addresses"

#: In grpc's UNAVAILABLE details: a TLS handshake refused a certificate (ours or the server's); permanent.
CERTIFICATE_REFUSED = "CERTIFICATE"
#: How such an error's message begins.
TLS_REFUSED = "etcd: the TLS handshake failed, a certificate was refused"


#: grpc's words when the server's certificate is not for the host name dialled.
HOST_NAME_REFUSED = "Hostname Verification Check failed"
#: grpc's words when the server ended a new TLS 1.3 session with an alert: in TLS 1.3 the server
#: checks the client's certificate after the client's side of the handshake is done, so its
#: refusal (etcd 3.6: ``certificate_required``, ``bad_certificate``) reaches grpc as an undecryptable
#: record of a connection that never carried a call (``NOT_SENT``).
REFUSED_AFTER_HANDSHAKE = "TSI_DATA_CORRUPTED"


def certificate_refused(code: Any, details: str) -> bool:
    """A TLS handshake failed over a certificate: retrying cannot help."""
    handshake = "handshake failed" in details.lower() and CERTIFICATE_REFUSED in details
    after_handshake = NOT_SENT in details and REFUSED_AFTER_HANDSHAKE in details
    return code is Code.UNAVAILABLE and (handshake or after_handshake or HOST_NAME_REFUSED in details)


#: etcd's INVALID_ARGUMENT details for a missing token and for wrong credentials.
_AUTH_FAILURES = ("user name is empty", "authentication failed")


class CompactedError(ConsensusError):
    """A read or watch asked for a revision that etcd has compacted away."""


class AuthDisabledError(ConsensusError):
    """etcd answered an authentication request with "authentication is not enabled"."""


def interrupted(what: str) -> OperationTimeoutError:
    """The error for a call cancelled because the session ran into trouble."""
    return OperationTimeoutError(f"{what} was interrupted by connection trouble; its effect is unknown")


def translate(exc: Any, what: str) -> ConsensusError:
    """The consensus_api error for a grpc error; never includes credentials."""
    code, details = exc.code(), exc.details() or ""
    if code is Code.DEADLINE_EXCEEDED:
        return OperationTimeoutError(f"etcd did not complete {what} in time; its effect is unknown")
    if certificate_refused(code, details):
        reason = details.rpartition("OPENSSL_internal:")[2].removesuffix(": OK")
        if HOST_NAME_REFUSED in details:
            reason = "the server's certificate is for another host name"
        elif REFUSED_AFTER_HANDSHAKE in details:
            reason = "the server refused the client certificate (missing, expired or not signed by its CA)"
        return ConfigurationError(f"{TLS_REFUSED}: {reason}")
    if code is Code.UNAVAILABLE:
        return OperationTimeoutError(f"lost the connection to etcd during {what}; its effect is unknown")
    if code is Code.NOT_FOUND and "lease not found" in details:
        return SessionLostError("the session's etcd lease is gone; the session is being re-established")
    if code is Code.FAILED_PRECONDITION and "authentication is not enabled" in details:
        return AuthDisabledError(details)
    if code is Code.OUT_OF_RANGE:
        return CompactedError(f"etcd compacted the revision {what} needed")
    if code is Code.PERMISSION_DENIED:  # the user's role does not cover the keys
        return PermissionDeniedError(f"etcd refused {what}: {details}")
    if code is Code.UNAUTHENTICATED or any(reason in details for reason in _AUTH_FAILURES):
        return ConfigurationError(f"etcd refused {what}: {details}")
    return ConsensusError(f"etcd failed {what}: {code.name}: {details}")
