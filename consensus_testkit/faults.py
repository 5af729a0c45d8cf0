"""Server-side faults for tests: end a client's session the way the server itself would.

``expire_session(session)`` asks the session's backend what names it on the
server (``Backend.fault_identity``, a test-only hook) and ends it with the
expirer its test profile declares (``TestProfile.expire_session``, see
``consensus_testkit.profile``): a client of the test's own acts on
the *server*, never the session's own client. The victim then sees what a real
expiry looks like: LOST, then CONNECTED with a new session, re-joining what
the application had joined.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from consensus_api.session import Session
from consensus_testkit.profile import profile_for


def expire_session(session: Session, timeout: float = 10.0) -> Mapping[str, Any]:
    """End ``session``'s current server-side session; returns the identity that was ended.

    Raises ValueError for a backend whose profile declares no server-side
    expiry or a session that has none right now (it is being re-established).
    """
    identity = session._backend.fault_identity()  # the SPI's test-only hook
    expire = profile_for(session.url).expire_session
    if expire is None:
        raise ValueError(f"the {session.backend} backend's test profile declares no server-side expiry")
    if not identity or any(value is None for value in identity.values()):
        raise ValueError(f"the {session.backend} session has no server-side session right now: {identity}")
    expire(session.url, identity, timeout)
    return identity
