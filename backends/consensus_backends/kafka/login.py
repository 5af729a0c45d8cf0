"""A blocking SASL login to one broker, so that a refused password is known at once.

The broker answers a failed SaslAuthenticate with an error response and closes
the connection at the same moment. kafka-python 3.0's transport drops bytes
read together with the end of the stream, so it often sees only a disconnect
and its bootstrap retries until its deadline. This probe reads each
length-prefixed response in full from a blocking socket before it could see
the close, with kafka-python's own request classes and SASL mechanisms.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Mapping
from typing import Any

import kafka.errors as kerrors
from kafka.net.sasl import get_sasl_mechanism
from kafka.protocol.parser import KafkaProtocol
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest

from consensus_backends.kafka.settings import CLIENT_ID

#: The protocol versions sent: SaslHandshake v1 announces SaslAuthenticate framing (KIP-152).
HANDSHAKE_VERSION = 1
AUTHENTICATE_VERSION = 1


def sasl_enabled(security: Mapping[str, Any]) -> bool:
    """Whether ``security`` (kafka-python's settings) logs in with SASL."""
    return str(security.get("security_protocol", "")).startswith("SASL_")


def log_in(sock: socket.socket, host: str, security: Mapping[str, Any], deadline: float) -> None:
    """Authenticate on ``sock`` (connected, TLS already set up) before ``deadline``.

    Raises ``SaslAuthenticationFailedError`` with the broker's message for a refused login,
    ``UnsupportedSaslMechanismError`` if the broker does not offer the mechanism,
    ``IllegalSaslStateError`` if the listener does not speak SASL at all, and
    ``KafkaConnectionError`` or ``OSError`` (``TimeoutError`` at ``deadline``) if the connection fails
    first.
    """
    parser = KafkaProtocol(client_id=CLIENT_ID)
    name = str(security["sasl_mechanism"])
    handshake = _call(sock, parser, deadline, SaslHandshakeRequest(mechanism=name, version=HANDSHAKE_VERSION))
    error = kerrors.for_code(handshake.error_code)
    if error is not kerrors.NoError and error is not kerrors.UnsupportedSaslMechanismError:
        raise error(f"SaslHandshake for {name}")
    if name not in handshake.mechanisms:
        raise kerrors.UnsupportedSaslMechanismError(f"the broker does not offer SASL {name}")
    mechanism = get_sasl_mechanism(name)(host=host, **security)
    while not mechanism.is_done():
        request = SaslAuthenticateRequest(auth_bytes=mechanism.auth_bytes(), version=AUTHENTICATE_VERSION)
        response = _call(sock, parser, deadline, request)
        error = kerrors.for_code(response.error_code)
        if error is not kerrors.NoError:
            raise kerrors.SaslAuthenticationFailedError(f"{error.__name__}: {response.error_message}")
        mechanism.receive(response.auth_bytes)
    if not mechanism.is_authenticated():
        raise kerrors.SaslAuthenticationFailedError(f"the broker's SASL {name} answer did not verify")


def _call(sock: socket.socket, parser: KafkaProtocol, deadline: float, request: Any) -> Any:
    """Send ``request`` and read its whole response, even if the broker closes right after it."""
    parser.send_request(request)
    sock.sendall(parser.send_bytes())
    while True:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        data = sock.recv(65536)
        if not data:
            raise kerrors.KafkaConnectionError("the broker closed the connection during the SASL login")
        responses = parser.receive_bytes(data)
        if responses:
            return responses[0][1]
