"""The etcd backend's group membership: a member is a key bound to the session's lease.

Guarantees:

* A member is a key created, bound to the session's lease, in one transaction
  that fails if the key exists (``lease.LeasedKeys``): a live member with that
  id is never replaced. Every member of a session vanishes with its lease.
* ``leave`` deletes the key only if this session's lease holds it; without a
  lease (the session was lost) the key is gone or soon will be.
* ``membership`` is one linearizable range read of the group's keys.
"""

from __future__ import annotations

import time

from pyetcd import etcdrpc

from consensus_api.errors import MemberExistsError
from consensus_backends.etcd.client import EtcdClient
from consensus_backends.etcd.layout import Layout, prefix_end
from consensus_backends.etcd.lease import LeasedKeys


class Membership:
    """The members of one backend session; each call is bounded by ``request_timeout``."""

    def __init__(
        self, client: EtcdClient, layout: Layout, leased: LeasedKeys, request_timeout: float
    ) -> None:
        self._client = client
        self._layout = layout
        self._leased = leased
        self._timeout = request_timeout

    def join(self, group: str, member_id: str, data: bytes) -> None:
        """Create the member key, bound to the lease, if no key has that id."""
        target = self._layout.member(group, member_id)
        if not self._leased.create(target, data, []).succeeded:
            raise MemberExistsError(f"group {group!r} already has a live member {member_id!r}")

    def leave(self, group: str, member_id: str) -> None:
        """Delete the member key if this session's lease holds it."""
        self._leased.release(
            self._layout.member(group, member_id), f"member {member_id!r} of group {group!r}"
        )

    def membership(self, group: str) -> dict[str, bytes]:
        """The member keys of ``group`` and their data."""
        prefix = self._layout.group(group)
        request = etcdrpc.RangeRequest(key=prefix, range_end=prefix_end(prefix))
        response = self._client.range(request, self._deadline())
        return {kv.key[len(prefix) :].decode(errors="replace"): bytes(kv.value) for kv in response.kvs}

    def _deadline(self) -> float:
        return time.monotonic() + self._timeout
