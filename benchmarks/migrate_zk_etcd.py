"""The time to migrate 10,000 keys from ZooKeeper to etcd, on servers started for the run.

    .venv/bin/python benchmarks/migrate_zk_etcd.py [--keys N] [--mode api|raw|both]

``api``: keys written through consensus-api on ``zookeeper://…/app``, copied
with ``migrate()`` (the ZooKeeper backend's ``walk``). ``raw``: a plain
ZooKeeper tree (100 directories, half of them holding data, each with the
rest of the keys as binary leaves) written with kazoo, copied with
``migrate(raw=True)``. Each copy goes to a fresh etcd prefix and is checked
with ``verify``. Prints keys/s per mode; setting up the source is not timed.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

from kazoo.client import KazooClient

import consensus_api as ca
from consensus_api.migrate import Action, migrate
from consensus_testkit import start_server

DIRECTORIES = 100


def write_api_tree(url: str, keys: int) -> None:
    """``keys`` keys below ``d000``… through the API, 16 writers in parallel."""
    with ca.connect(url) as session, ThreadPoolExecutor(16) as pool:
        names = [f"d{index % DIRECTORIES:03d}/k{index:05d}" for index in range(keys)]
        list(pool.map(lambda name: session.storage.put(name, name.encode() + b"\x00\xff"), names))


def write_raw_tree(hosts: str, root: str, keys: int) -> int:
    """A raw tree of ``keys`` keys below ``root``; returns how many znodes are keys."""
    client = KazooClient(hosts=hosts, timeout=30)
    client.start(timeout=30)
    try:
        client.ensure_path(root)
        directories = [
            client.create_async(f"{root}/d{d:03d}", b"dir %d" % d if d % 2 else b"")
            for d in range(DIRECTORIES)
        ]
        for request in directories:
            request.get(timeout=30)
        leaves = keys - DIRECTORIES // 2
        writes = [
            client.create_async(f"{root}/d{i % DIRECTORIES:03d}/k{i:05d}", bytes([i % 256, 0, 255]))
            for i in range(leaves)
        ]
        for request in writes:
            request.get(timeout=30)
        return leaves + DIRECTORIES // 2
    finally:
        client.stop()
        client.close()


def timed(name: str, source: str, target: str, expected: int, *, raw: bool) -> float:
    """Migrate, check the counts and ``verify``; print and return keys/s."""
    started = time.monotonic()
    report = migrate(source, target, raw=raw)
    elapsed = time.monotonic() - started
    created = report.counts[Action.CREATE]
    if created != expected or report.unholdable:
        sys.exit(f"{name}: created {created} of {expected} keys; unholdable: {report.unholdable[:5]}")
    differences = migrate(source, target, raw=raw, verify=True).differences
    if differences:
        sys.exit(f"{name}: {len(differences)} differences after the copy, e.g. {differences[:3]}")
    rate = expected / elapsed
    print(f"{name}: {expected} keys ZooKeeper -> etcd in {elapsed:.1f} s: {rate:.0f} keys/s (verified)")
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--mode", choices=("api", "raw", "both"), default="both")
    args = parser.parse_args()
    with start_server("zookeeper") as zookeeper, start_server("etcd") as etcd:
        hosts = zookeeper.url.split("://", 1)[1].split("/", 1)[0]
        run = uuid.uuid4().hex[:8]
        if args.mode in ("api", "both"):
            source = f"zookeeper://{hosts}/bench-api-{run}"
            write_api_tree(source, args.keys)
            timed("api", source, f"{etcd.url}/api-{run}", args.keys, raw=False)
        if args.mode in ("raw", "both"):
            root = f"/bench-raw-{run}"
            expected = write_raw_tree(hosts, root, args.keys)
            timed("raw", f"zookeeper://{hosts}{root}", f"{etcd.url}/raw-{run}", expected, raw=True)


if __name__ == "__main__":
    main()
