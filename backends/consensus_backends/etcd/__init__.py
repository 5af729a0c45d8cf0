"""The etcd v3 backend of consensus-api (``etcd://h1:2379,h2:2379/prefix``), over etcd-sdk-python."""

from consensus_backends.etcd.backend import EtcdBackend

__all__ = ["EtcdBackend"]
