"""The HTML report of ``consensus check``, opened in a real headless browser (Debian's chromium through
its chromedriver, driven by Selenium): the timeline has a lane per process and the fault windows
shaded, and a finding's link lands on the operation it cites, highlighted."""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from test_checker import VIOLATIONS

from consensus_chaos.check import check_history
from consensus_chaos.check.report import render, write_report
from consensus_chaos.check.report_history import MAX_LANES
from consensus_chaos.cli.check import check
from consensus_chaos.record.convert import write_history
from consensus_chaos.record.schema import COLUMNS, NEMESIS_PROCESS

RUN = "planted"
KEY = f"chaos/{RUN}/k0"
SERVICE = f"chaos/{RUN}/s0"
LOCK = f"chaos/{RUN}/locks/l0"
MS = 1_000_000


class History:
    """A hand-made history of one run; times in milliseconds."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.op_id = 0

    def row(self, process: int, type_: str, f: str, t: int, **fields: Any) -> None:
        row = dict.fromkeys(COLUMNS)
        client = process % 3 if process >= 0 else NEMESIS_PROCESS
        row.update(run=RUN, backend="test", process=process, client=client, type=type_, f=f, time_ns=t * MS)
        row.update(fields)
        self.rows.append(row)

    def op(self, process: int, f: str, call: int, ret: int, outcome: str = "ok", **fields: Any) -> int:
        """An operation; ``done`` fields go on its completion only; returns its op_id."""
        self.op_id += 1
        done = fields.pop("done", {})
        kind = fields.pop("kind", "kv")
        self.row(process, "invoke", f, call, kind=kind, op_id=self.op_id, **fields)
        self.row(process, outcome, f, ret, kind=kind, op_id=self.op_id, **fields, **done)
        return self.op_id

    def save(self, directory: Path) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        write_history(sorted(self.rows, key=lambda r: r["time_ns"]), directory / f"{RUN}.parquet")
        return directory


def planted() -> tuple[History, int]:
    """Three processes writing and reading one key, a leader, a lock, a paused client, and one stale
    read planted at the end: process 2 reads version 1 after version 2 was written. Returns the history
    and the stale read's op_id."""
    h = History()
    h.op(0, "put", 0, 5, key=KEY, value="v0", done={"version": 1})
    for i in range(200):  # background: many short reads of version 1 by processes 1 and 2
        h.op(1 + i % 2, "fetch", 10 + 10 * i, 12 + 10 * i, key=KEY, done={"value": "v0", "version": 1})
    h.op(0, "update", 2100, 2110, key=KEY, value="v1", done={"version": 2})
    h.op(0, "put", 2200, 2205, "fail", key=KEY, value="v2", error="KeyExistsError")
    stale = h.op(2, "fetch", 2300, 2310, key=KEY, done={"value": "v0", "version": 1})
    election = {"kind": "election", "service": SERVICE}
    h.op(0, "nominate", 20, 30, value="c0", done={"leader": "c0"}, **election)
    h.row(0, "event", "leader", 31, leader="c0", term=1, **election)
    h.row(0, "event", "leader", 1500, **election)
    h.row(0, "event", "leader", 1600, leader="c1", term=2, **election)
    lock = {"kind": "lock", "key": LOCK, "value": "exclusive"}
    h.op(0, "acquire", 40, 50, done={"term": 1, "leader": "h0"}, **lock)
    h.op(0, "release", 400, 410, term=1, leader="h0", **lock)
    h.op(0, "acquire", 500, 520, done={"term": 2, "leader": "h1"}, **lock)
    h.op(0, "release", 900, 905, term=2, leader="h1", **lock)
    h.op_id += 1
    h.row(NEMESIS_PROCESS, "invoke", "pause-client", 800, kind="nemesis", op_id=h.op_id, value="client 1")
    h.row(
        NEMESIS_PROCESS, "ok", "pause-client", 1300, kind="nemesis", op_id=h.op_id, value="client 1: paused"
    )
    return h, stale


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    """Headless chromium from Debian (``scripts/install.sh`` installs chromium and chromium-driver)."""
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    assert chromium and driver, "install Debian's chromium and chromium-driver (scripts/install.sh)"
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,900"):
        options.add_argument(argument)
    session = webdriver.Chrome(options=options, service=Service(driver))
    yield session
    session.quit()


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    """The report of the planted history, written by ``consensus check --report``, and the op_id of
    the stale read."""
    history, stale = planted()
    directory = history.save(tmp_path_factory.mktemp("history"))
    path = directory.parent / "report.html"
    result = CliRunner().invoke(check, [str(directory), "--engine", "local", "--report", str(path)])
    assert result.exit_code == 1, result.output  # the planted violation
    return path, stale


def test_timeline_has_a_lane_per_process_and_the_fault_shaded(
    browser: WebDriver, report: tuple[Path, int]
) -> None:
    path, _ = report
    browser.get(path.as_uri())
    [timeline] = browser.find_elements(By.CSS_SELECTOR, "svg.timeline")
    lanes = timeline.find_elements(By.CSS_SELECTOR, "g.lane")
    assert sorted(int(lane.get_attribute("data-process") or "") for lane in lanes) == [0, 1, 2]
    [fault] = timeline.find_elements(By.CSS_SELECTOR, "g.fault")
    assert fault.get_attribute("data-fault") == "pause-client"
    shade = fault.find_element(By.CSS_SELECTOR, "rect.shade")
    box = browser.execute_script(
        "const b = arguments[0].getBoundingClientRect(); return [b.width, b.height]", shade
    )
    lanes_box = browser.execute_script(
        "const b = arguments[0].map(l => l.getBoundingClientRect()); "
        "return Math.max(...b.map(r => r.bottom)) - Math.min(...b.map(r => r.top))",
        lanes,
    )
    assert box[0] > 20  # 0.5 s of a 2.3 s run on about 1000 pixels
    assert box[1] >= lanes_box  # across every lane
    assert "pause-client client 1" in fault.text
    strips = {s.get_attribute("class") for s in timeline.find_elements(By.CSS_SELECTOR, "g.strip")}
    assert strips == {"strip leader", "strip lock"}


def test_finding_link_lands_on_the_highlighted_operation(
    browser: WebDriver, report: tuple[Path, int]
) -> None:
    path, stale = report
    browser.get(path.as_uri())
    [finding] = browser.find_elements(By.CSS_SELECTOR, ".finding")
    assert "linearizability" in finding.text
    [link] = finding.find_elements(By.CSS_SELECTOR, "a.cite.marked")
    link.click()
    target = browser.execute_script("return document.querySelector(':target')")
    assert target is not None, f"the link {link.get_attribute('href')} lands on no element"
    assert target.get_attribute("id") == f"run0-op{stale}"  # the stale read, by its op_id
    assert "cited" in (target.get_attribute("class") or "")
    assert browser.execute_script("return arguments[0].closest('svg.timeline') !== null", target)
    assert browser.execute_script(
        "const b = arguments[0].getBoundingClientRect(); return b.top >= 0 && b.bottom <= innerHeight", target
    ), "the link did not scroll the operation into view"
    style = browser.execute_script("return getComputedStyle(arguments[0]).animationName", target)
    assert style == "pulse"  # highlighted as the link's target


def test_report_without_the_history_has_findings_and_no_links(tmp_path: Path) -> None:
    history, _ = planted()
    outcome = check_history(history.save(tmp_path), "local")
    page = render(outcome)
    assert "linearizability" in page
    assert "<svg class='slice'" in page
    assert "svg class='timeline'" not in page
    assert "a class='cite" not in page
    write_report(outcome, tmp_path / "r.html", tmp_path)
    assert "svg class='timeline'" in (tmp_path / "r.html").read_text()


@pytest.mark.parametrize("name", sorted(VIOLATIONS))
def test_every_link_of_every_finding_lands_on_a_drawn_item(tmp_path: Path, name: str) -> None:
    """The planted violations of test_checker.py (operations, events, reads; processes that only
    observe): every link of a finding names an element of the timeline, the cited item."""
    build, _ = VIOLATIONS[name]
    directory = build().save(tmp_path)
    page = render(check_history(directory, "local"), directory)
    links = re.findall(r"<a class='cite[^']*' href='#([^']+)'", page)
    assert links
    timeline = page[page.index("<svg class='timeline'") :]
    for link in links:
        assert re.search(f"id='{re.escape(link)}' class='cited'", timeline), link


def test_many_processes_keep_the_cited_lanes(tmp_path: Path) -> None:
    """Past MAX_LANES processes the lanes a finding cites are drawn first, and their links hold."""
    h = History()
    h.op(0, "put", 0, 5, key=KEY, value="v0", done={"version": 1})
    h.op(0, "update", 10, 15, key=KEY, value="v1", done={"version": 2})
    for process in range(1, MAX_LANES + 50):  # one read each, the last one stale
        stale = process == MAX_LANES + 49
        version = {"value": "v0", "version": 1} if stale else {"value": "v1", "version": 2}
        h.op(process, "fetch", 20 + process, 21 + process, key=KEY, done=version)
    directory = h.save(tmp_path)
    page = render(check_history(directory, "local"), directory)
    lanes = re.findall(r"<g class='lane' data-process='(\d+)'", page)
    assert len(lanes) == MAX_LANES
    assert str(MAX_LANES + 49) in lanes
    assert "(50 more without a lane)" in page
    [link] = re.findall(r"<a class='cite marked' href='#([^']+)'", page)
    assert f"id='{link}' class='cited'" in page
