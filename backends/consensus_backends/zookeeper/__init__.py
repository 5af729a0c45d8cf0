"""The ZooKeeper backend (kazoo): ``zookeeper://h1:2181,h2:2181/chroot`` or ``zk://...``."""

from consensus_backends.zookeeper.backend import ZooKeeperBackend

__all__ = ["ZooKeeperBackend"]
