"""The command records of the replicated log, and their wire format.

Every write is one Kafka record: the value is the stored bytes (empty for
commands without a value) and the headers say what to do and under which
precondition. Records have no key (the topic is never compacted). Headers:

=========  ====================================================================
``ca``     format marker, ``1``
``op``     ``put`` | ``update`` | ``delete`` | ``lead`` | ``unlead`` | ``depart`` | ``seal`` | ``unseal``
``k``      the key (storage commands) or the service (``lead`` / ``unlead``); empty for the others
``ver``    expected version (``update`` / ``delete`` with ``version=``)
``fs``     fence: service; ``fl`` its leader id; ``ft`` its term
``cand``   ``lead`` / ``unlead``: the candidate id
``mid``    ``lead`` / ``unlead``: the candidate's Kafka group member id
``term``   ``lead``: the term the claim replaces; ``unlead``: the term given up
``sid``    writer session id; ``rid`` its request number (to hand back the outcome)
=========  ====================================================================

A ``depart`` record's value is JSON ``[[Kafka group id, Kafka member id], ...]``:
members that left for good (:mod:`consensus_backends.kafka.departures`).
Integers are decimal ASCII. A record without the marker, or one this version
cannot parse, is skipped by every reader alike. ``seal`` and ``unseal`` change
how every later write is decided (``state``), so every session of a store that
is sealed must run a version that reads them: an older one would skip them and
take a refused write for applied.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Sequence
from dataclasses import dataclass

from consensus_api.model import Leadership

MARKER = ("ca", b"1")

Headers = list[tuple[str, bytes]]


class Op(enum.Enum):
    """What a command does."""

    PUT = "put"
    UPDATE = "update"
    DELETE = "delete"
    LEAD = "lead"
    UNLEAD = "unlead"
    DEPART = "depart"
    SEAL = "seal"
    UNSEAL = "unseal"


@dataclass(frozen=True, slots=True)
class Command:
    """One write, with its precondition; ``name`` is a key or, for ``LEAD``/``UNLEAD``, a service."""

    op: Op
    name: str
    value: bytes = b""
    version: int | None = None
    fence: Leadership | None = None
    candidate: str | None = None
    member: str | None = None
    term: int = 0
    origin: tuple[str, int] | None = None


def encode(command: Command) -> tuple[Headers, bytes]:
    """The record headers and value of ``command``."""
    headers: Headers = [MARKER, ("op", command.op.value.encode()), ("k", command.name.encode())]
    if command.version is not None:
        headers.append(("ver", str(command.version).encode()))
    if command.fence is not None:
        headers += [
            ("fs", command.fence.service.encode()),
            ("fl", command.fence.leader_id.encode()),
            ("ft", str(command.fence.term).encode()),
        ]
    if command.op in (Op.LEAD, Op.UNLEAD):
        headers += [
            ("cand", (command.candidate or "").encode()),
            ("mid", (command.member or "").encode()),
            ("term", str(command.term).encode()),
        ]
    if command.origin is not None:
        headers += [("sid", command.origin[0].encode()), ("rid", str(command.origin[1]).encode())]
    return headers, command.value


def decode(headers: Sequence[tuple[str, bytes]], value: bytes | None) -> Command | None:
    """The command a record holds, or None for a record that is not a (readable) command."""
    fields = dict(headers)
    if fields.get(MARKER[0]) != MARKER[1]:
        return None
    try:
        op = Op(fields["op"].decode())
        fence = None
        if "fs" in fields:
            fence = Leadership(fields["fs"].decode(), fields["fl"].decode(), int(fields["ft"]))
        origin = (fields["sid"].decode(), int(fields["rid"])) if "sid" in fields else None
        return Command(
            op=op,
            name=fields["k"].decode(),
            value=value or b"",
            version=int(fields["ver"]) if "ver" in fields else None,
            fence=fence,
            candidate=fields["cand"].decode() if "cand" in fields else None,
            member=fields["mid"].decode() if "mid" in fields else None,
            term=int(fields.get("term", b"0")),
            origin=origin,
        )
    except (KeyError, ValueError, UnicodeDecodeError):
        return None


def encode_departures(departures: Sequence[tuple[str, str]]) -> bytes:
    """The value of a ``depart`` command naming ``(group id, Kafka member id)`` pairs."""
    return json.dumps([list(pair) for pair in departures]).encode()


def decode_departures(value: bytes) -> list[tuple[str, str]]:
    """The ``(group id, Kafka member id)`` pairs of a ``depart`` value ([] if unreadable)."""
    try:
        pairs = json.loads(value)
        return [(str(group_id), str(member_id)) for group_id, member_id in pairs]
    except (ValueError, TypeError):
        return []
