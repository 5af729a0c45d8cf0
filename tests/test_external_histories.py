"""Jepsen's etcd register histories and porcupine's KV histories, with their published verdicts.

Every file in tests/data/external-histories is checked with both engines and must get the verdict
``verdicts.json`` gives it (porcupine's own assertions; Knossos agrees on the etcd set).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from consensus_api.cli import cli
from consensus_chaos.check import models, wgl
from consensus_chaos.check.external import check_files
from consensus_chaos.check.external_report import render
from consensus_chaos.check.jepsen import HistoryParseError, parse

pytest.importorskip("pyarrow")

DATA = Path(__file__).parent / "data" / "external-histories"
EXPECTED: dict[str, dict[str, bool]] = json.loads((DATA / "verdicts.json").read_text())
SUBSETS = {"jepsen-etcd": ("jepsen-log", "register"), "kv": ("jepsen-edn", "kv")}


def run_cli(*args: str) -> Any:
    return CliRunner().invoke(cli, ["check", *args], catch_exceptions=False)


def linearizable(subset: str, engine: str, session: Any = None) -> dict[str, bool]:
    fmt, model = SUBSETS[subset]
    verdicts = check_files(DATA / subset, fmt, model, engine=engine, session=session)
    assert {v.verdict for v in verdicts} <= {"ok", "violation"}
    return {Path(v.path).name: v.verdict == "ok" for v in verdicts}


@pytest.mark.parametrize("subset", sorted(SUBSETS))
def test_every_file_gets_its_published_verdict_locally(subset: str) -> None:
    assert len(EXPECTED[subset]) == len(list((DATA / subset).iterdir()))
    assert linearizable(subset, "local") == EXPECTED[subset]


def test_spark_engine_gets_the_same_verdicts(spark: Any) -> None:
    for subset in SUBSETS:
        assert linearizable(subset, "spark", spark) == EXPECTED[subset]


def test_cli_exit_codes_per_file_and_directory() -> None:
    etcd, kv = DATA / "jepsen-etcd", DATA / "kv"
    local = ("--engine", "local")
    assert (
        run_cli(str(etcd / "etcd_000.log"), "--format", "jepsen-log", "--model", "register", *local).exit_code
        == 1
    )
    assert (
        run_cli(str(etcd / "etcd_002.log"), "--format", "jepsen-log", "--model", "register", *local).exit_code
        == 0
    )
    assert run_cli(str(kv / "c10-ok.txt"), "--format", "jepsen-edn", "--model", "kv", *local).exit_code == 0
    assert run_cli(str(kv / "c01-bad.txt"), "--format", "jepsen-edn", "--model", "kv", *local).exit_code == 1
    assert run_cli(str(kv), "--format", "jepsen-edn", *local).exit_code == 1


def test_json_and_report_show_the_violation(tmp_path: Path) -> None:
    report = tmp_path / "report.html"
    path = DATA / "kv" / "c01-bad.txt"
    result = run_cli(
        str(path), "--format", "jepsen-edn", "--engine", "local", "--json", "--report", str(report)
    )
    assert result.exit_code == 1
    [found] = json.loads(result.output)["files"]
    assert (found["verdict"], found["operations"], found["keys"]) == ("violation", 38, 8)
    assert found["seconds"] >= 0
    violation = found["violation"]
    assert violation["key"] == "7"
    window = violation["window"]
    assert 1 < len(window) <= 5
    assert [item["label"] for item in window if item["mark"]] == ['get -> "x 0 0 y"']
    page = report.read_text()
    assert "<svg" in page and "longest linearizable prefix" in page and "Minimal failing window" in page


def test_etcd_violation_window_is_a_violation_on_its_own(tmp_path: Path) -> None:
    [verdict] = check_files(DATA / "jepsen-etcd" / "etcd_000.log", "jepsen-log", "register", explain=True)
    window = verdict.violation["window"]
    assert 0 < len(window) < verdict.operations
    assert "etcd_000.log" in render([verdict], "local")


@pytest.mark.parametrize(
    ("text", "line", "reason"),
    [
        (
            "INFO  jepsen.util - 0\t:invoke\t:read\tnil\nINFO  jepsen.util - 0\t:ok\t:read\t[1\n",
            2,
            "expected a value",
        ),
        (
            "INFO  jepsen.util - 0\t:invoke\t:read\tnil\n\nINFO  jepsen.util - 0\t:invoke\t:read\tnil\n",
            3,
            "is open",
        ),
        ("INFO  jepsen.util - 0\t:ok\t:write\t1\n", 1, "without a matching invoke"),
        ("INFO  jepsen.util - 0\t:invoke\t:append\t1\n", 1, "not :append"),
        ("INFO  jepsen.util - 0\t:invoke\t:cas\t[1]\n", 1, "cas needs [from to]"),
        ("INFO  jepsen.util - 0\t:done\t:read\tnil\n", 1, "unknown type :done"),
        ("garbage\n", 1, "not a log line"),
    ],
)
def test_unparseable_log_names_the_line(tmp_path: Path, text: str, line: int, reason: str) -> None:
    path = tmp_path / "bad.log"
    path.write_text(text)
    with pytest.raises(HistoryParseError) as raised:
        parse(path, text, "jepsen-log", "register")
    assert (raised.value.line, reason in raised.value.reason) == (line, True)
    result = run_cli(str(path), "--format", "jepsen-log", "--engine", "local", "--json")
    assert result.exit_code == 2
    [found] = json.loads(result.output)["files"]
    assert found["verdict"] == "invalid" and f"bad.log:{line}:" in found["error"]


def test_unparseable_edn_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.txt"
    invoke = '{:process 0, :type :invoke, :f :get, :key "1", :value nil}'
    path.write_text(f"{invoke}\n{invoke.replace(':invoke', ':ok')}\n")
    result = run_cli(str(path), "--format", "jepsen-edn", "--engine", "local")
    assert result.exit_code == 2
    unwrapped = "".join(result.output.split())  # the console may wrap a long path anywhere
    assert "bad.txt:2:getmustreturnastring" in unwrapped


def test_info_and_fail_semantics() -> None:
    """``:info`` may take effect any time after its invoke, or never; ``:fail`` never took effect."""
    lines = [
        "0 :invoke :write 1",
        ':nemesis :info :start "Cut off {:n5 #{:n3 :n1}}"',  # a fault, not an operation
        "0 :ok :write 1",
        "1 :invoke :write 2",
        "1 :info :write :timed-out",  # may take effect later
        "2 :invoke :cas [1 3]",
        "2 :fail :cas [1 3]",  # never took effect
        "3 :invoke :read nil",
        "3 :ok :read 1",
        "4 :invoke :read nil",
        "4 :ok :read 2",  # the timed-out write took effect
    ]

    def verdict(rows: list[str]) -> str:
        text = "".join(f"INFO  jepsen.util - {row}\n" for row in rows)
        ops = parse(Path("h.log"), text, "jepsen-log", "register")
        calls, rets, steps = [o.call for o in ops], [o.ret for o in ops], [o.op for o in ops]
        kind = models.REGISTER
        return wgl.search(calls, rets, steps, kind.step, initial=kind.initial, budget=wgl.Budget()).verdict

    assert verdict(lines) == wgl.OK
    assert verdict(lines[:9]) == wgl.OK  # ... or never
    assert (
        verdict([*lines, "5 :invoke :read nil", "5 :ok :read 3"]) == wgl.ILLEGAL
    )  # the failed cas did nothing
    assert (
        verdict([*lines, "5 :invoke :read nil", "5 :ok :read 1"]) == wgl.ILLEGAL
    )  # 2 was written: no going back
