"""``consensus migrate`` against real servers: ZooKeeper trees to etcd and PostgreSQL, follow, resume, refuse.

The 10,000-key tree is a raw ZooKeeper tree written with kazoo's async API:
nested directories (half of them holding data, so they are keys with keys
below them), binary and empty values, a 500 KB value, non-ASCII names, an
ephemeral znode (never copied) and two paths no target can hold.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from typing import Any

import pytest
from kazoo.client import KazooClient
from migrate_support import CLI, WAIT, Tree, api_tree, hosts, raw_tree, settle, stored, value_of

import consensus_api as ca
from consensus_api import BackendUnavailableError
from consensus_api.migrate import LEDGER, Action, MigrationConflictError, Report, migrate
from consensus_testkit import ServerHandle
from consensus_testkit.host import HOST, free_port


class StopCopyError(Exception):
    """Raised by a progress callback to stop a copy midway."""


@pytest.fixture(scope="module")
def big_tree(zookeeper_server: ServerHandle, kazoo: KazooClient) -> Tree:
    """10,000 keys (and two unholdable paths) below a fresh root, written with pipelined creates."""
    root = f"/legacy-{uuid.uuid4().hex[:8]}"
    expected: dict[str, bytes] = {}
    kazoo.ensure_path(root)
    directories = []
    for d in range(100):
        data = b"dir %d" % d if d % 2 else b""
        if data:
            expected[f"d{d:03d}"] = data
        directories.append((f"d{d:03d}", data))
    nested = {f"deep/a/b/c/leaf{i:02d}": value_of(i) for i in range(46)}
    others = {
        "deep/a": b"intermediate with data",
        "uni/ключ": b"\xd0\x00",
        "uni/値": b"\xff\xfe",
        "x/y": os.urandom(500_000),
    }
    leaves = {f"d{i % 100:03d}/k{i:04d}": value_of(i) for i in range(9900)}
    expected.update(nested | others | leaves)
    for path in ("deep/a/b/c", "uni", "x", "eph", "bad", "long/" + "/".join(["a" * 250] * 5)):
        kazoo.ensure_path(f"{root}/{path}")
    kazoo.set(f"{root}/deep/a", others["deep/a"])
    settle([kazoo.create_async(f"{root}/{name}", data) for name, data in directories])
    settle(
        [
            kazoo.create_async(f"{root}/{name}", data)
            for name, data in (nested | others | leaves).items()
            if name != "deep/a"
        ]
    )
    kazoo.create(f"{root}/eph/member", b"ephemeral", ephemeral=True)
    unholdable = {"bad/" + "s" * 300, "long/" + "/".join(["a" * 250] * 5) + "/z"}
    for path in unholdable:
        kazoo.create(f"{root}/{path}", b"cannot be held")
    assert len(expected) == 10_000
    return Tree(f"zookeeper://{hosts(zookeeper_server)}{root}", root, expected, unholdable)


# Copying


@pytest.mark.parametrize("backend", ["etcd", "postgresql"])
def test_raw_tree_of_10000_keys_is_copied_byte_for_byte(backend: str, big_tree: Tree, request: Any) -> None:
    target = request.getfixturevalue(f"{backend}_target")
    report = migrate(big_tree.url, target, raw=True)
    copied = stored(target)
    assert sorted(set(copied) ^ set(big_tree.expected)) == []
    assert copied == big_tree.expected
    assert report.counts[Action.CREATE] == 10_000 and report.written == 10_000
    assert {path for path, _ in report.unholdable} == big_tree.unholdable
    verified = migrate(big_tree.url, target, raw=True, verify=True)
    assert {(d.key, d.kind) for d in verified.differences} == {(p, "unholdable") for p in big_tree.unholdable}
    again = migrate(big_tree.url, target, raw=True)
    assert again.counts[Action.UNCHANGED] == 10_000 and again.written == 0


def test_api_written_tree_is_copied_without_ephemeral_state(
    zookeeper_server: ServerHandle, etcd_target: str
) -> None:
    source, expected = api_tree(zookeeper_server, 150)
    with ca.connect(source) as session:
        session.group("workers").join("w1", b"member data")
        assert session.election("scheduler").nominate("c1")
        report = migrate(source, etcd_target)
    assert report.counts[Action.CREATE] == len(expected) and report.ok
    assert stored(etcd_target) == expected
    assert migrate(source, etcd_target, verify=True).differences == []
    with ca.connect(etcd_target) as session:
        assert session.group("workers").members() == frozenset()
        assert session.election("scheduler").leader() is None
    assert stored(etcd_target, "ns0") == {
        key: value for key, value in expected.items() if key.startswith("ns0/")
    }


def test_prefix_copies_the_key_and_the_keys_below_it(
    zookeeper_server: ServerHandle, etcd_target: str
) -> None:
    source, expected = api_tree(zookeeper_server, 150)
    migrate(source, etcd_target, prefix="ns0")
    assert stored(etcd_target) == {k: v for k, v in expected.items() if k == "ns0" or k.startswith("ns0/")}


def test_dry_run_lists_and_writes_nothing(
    zookeeper_server: ServerHandle, kazoo: KazooClient, etcd_target: str
) -> None:
    tree = raw_tree(zookeeper_server, kazoo, 50)
    report = migrate(tree.url, etcd_target, raw=True, dry_run=True)
    assert sorted(key for action, key in report.planned if action is Action.CREATE) == sorted(tree.expected)
    with ca.connect(etcd_target) as session:
        assert list(session.storage.walk("")) == []


def test_walk_and_chained_migrations_on_sqlite(tmp_path: Any) -> None:
    """Storage.walk("") sees every depth; a target's ledger is never copied onwards."""
    first, second, third = (f"sqlite:///{tmp_path / name}.db" for name in ("a", "b", "c"))
    expected = {"a": b"1", "a/b/c": b"\x00", "a%/x": b"%", "a_/y": b"_", "z/" + "q" * 255: b""}
    with ca.connect(first) as session:
        for key, value in expected.items():
            session.storage.put(key, value)
        assert {key: found.value for key, found in session.storage.walk()} == expected
        assert dict(session.storage.walk("a")).keys() == {"a/b/c"}
        with pytest.raises(ca.InvalidKeyError):
            session.storage.walk("a//b")
    migrate(first, second)
    migrate(second, third)
    ledgers = []
    for url in (second, third):
        with ca.connect(url) as session:
            ledgers.append({key for key, _ in session.storage.walk(LEDGER)})
    assert stored(third) == expected and ledgers[0] and ledgers[1] and not ledgers[0] & ledgers[1]
    assert migrate(second, third, verify=True).differences == []


# Resuming, refusing, failing


def test_interrupted_copy_resumes_to_the_same_result(
    zookeeper_server: ServerHandle, kazoo: KazooClient, postgresql_target: str
) -> None:
    tree = raw_tree(zookeeper_server, kazoo, 2000)
    done = 0

    def stop_midway(report: Report) -> None:
        nonlocal done
        done += 1
        if done == 800:
            raise StopCopyError

    with pytest.raises(StopCopyError):
        migrate(tree.url, postgresql_target, raw=True, progress=stop_midway)
    partial = stored(postgresql_target)
    assert 700 < len(partial) < 2000
    copied = sorted(partial)
    kazoo.set(f"{tree.root}/{copied[0]}", b"changed on the source meanwhile")
    kazoo.delete(f"{tree.root}/{copied[1]}")
    with ca.connect(postgresql_target) as client:
        client.storage.update(copied[2], b"a client wrote this")
    report = migrate(tree.url, postgresql_target, raw=True)
    assert report.counts[Action.CREATE] == 2000 - len(partial)
    assert report.counts[Action.UPDATE] == 1 and report.counts[Action.DELETE] == 1
    assert report.conflicts == [copied[2]]
    final = stored(postgresql_target)
    expected = dict(tree.expected)
    expected[copied[0]] = b"changed on the source meanwhile"
    del expected[copied[1]]
    expected[copied[2]] = b"a client wrote this"
    assert final == expected


def test_rerun_after_the_switch_leaves_client_writes_alone(
    zookeeper_server: ServerHandle, etcd_target: str
) -> None:
    source, expected = api_tree(zookeeper_server, 40)
    migrate(source, etcd_target)
    with ca.connect(etcd_target) as client:
        client.storage.update("ns1/sub1/k001", b"client update")
        client.storage.delete("ns2/sub2/k002")
        client.storage.put("ns3/client-only", b"client key")
    with ca.connect(source) as session:
        session.storage.update("ns4/sub1/k004", b"source update")
        session.storage.delete("ns0/sub0/k000")
    report = migrate(source, etcd_target)
    assert report.counts[Action.UPDATE] == 1 and report.counts[Action.DELETE] == 1
    assert report.conflicts == ["ns1/sub1/k001", "ns2/sub2/k002", "ns3/client-only"]
    expected |= {
        "ns1/sub1/k001": b"client update",
        "ns3/client-only": b"client key",
        "ns4/sub1/k004": b"source update",
    }
    del expected["ns2/sub2/k002"], expected["ns0/sub0/k000"]
    assert stored(etcd_target) == expected


def test_cli_interrupted_by_sigint_resumes(big_tree: Tree, etcd_target: str) -> None:
    command = [*CLI, "migrate", "--from", big_tree.url, "--to", etcd_target, "--raw"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + WAIT
        while len(stored(etcd_target)) < 500 and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.2)
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=WAIT)
    finally:
        process.kill()
    assert process.returncode == 130, err.decode()
    assert b"run the same command again to resume" in err
    assert len(stored(etcd_target)) < 10_000
    resumed = subprocess.run(command, capture_output=True, timeout=WAIT * 2, check=False)
    assert resumed.returncode == 1, resumed.stderr.decode()  # the two unholdable paths
    assert b"cannot be held" not in resumed.stdout and b"keys the target cannot hold" in resumed.stderr
    assert stored(etcd_target) == big_tree.expected
    verify = subprocess.run([*command, "--verify"], capture_output=True, timeout=WAIT, check=False)
    assert verify.returncode == 1
    assert sorted(line.split()[1] for line in verify.stdout.decode().splitlines()) == sorted(
        big_tree.unholdable
    )


def test_target_with_other_data_is_refused_without_overwrite(
    zookeeper_server: ServerHandle, postgresql_target: str
) -> None:
    source, expected = api_tree(zookeeper_server, 30)
    with ca.connect(postgresql_target) as session:
        session.storage.put("ns1/sub1/k001", b"other data")
        session.storage.put("ns2/only-here", b"not in the source")
    with pytest.raises(MigrationConflictError) as refused:
        migrate(source, postgresql_target)
    assert refused.value.conflicts == ["ns1/sub1/k001", "ns2/only-here"]
    assert stored(postgresql_target) == {
        "ns1/sub1/k001": b"other data",
        "ns2/only-here": b"not in the source",
    }
    cli = subprocess.run(
        [*CLI, "migrate", "--from", source, "--to", postgresql_target],
        capture_output=True,
        timeout=WAIT,
        check=False,
    )
    assert cli.returncode == 1 and b"--overwrite" in cli.stderr
    report = migrate(source, postgresql_target, overwrite=True)
    assert report.counts[Action.UPDATE] == 1 and report.counts[Action.DELETE] == 1
    assert stored(postgresql_target) == expected
    assert migrate(source, postgresql_target, verify=True).differences == []


def test_unreachable_source_or_target(etcd_server: ServerHandle) -> None:
    closed = free_port()
    options = {"connect_timeout": 1}
    with pytest.raises(BackendUnavailableError, match="source"):
        migrate(f"zookeeper://{HOST}:{closed}/x", etcd_server.url, raw=True, options=options)
    with pytest.raises(BackendUnavailableError, match="target"):
        migrate(etcd_server.url, f"etcd://{HOST}:{closed}/x", options=options)
    cli = subprocess.run(
        [*CLI, "migrate", "--from", f"etcd://{HOST}:{closed}/x?connect_timeout=1", "--to", etcd_server.url],
        capture_output=True,
        timeout=WAIT,
        check=False,
    )
    assert cli.returncode == 2 and b"source is unreachable" in cli.stderr
