"""Internals of ``consensus_api.migrate``: sources, the ownership ledger, the copier and the follower.

The public API is ``consensus_api.migrate``; the protocols in ``source`` are
what a raw tree reader (``consensus_backends.zookeeper.raw``) implements.
"""
