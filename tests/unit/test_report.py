"""Plan reports: the timeline's rules per objective, the HTML page and its SVG charts, PNGs, files."""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

import models
from models.synthetic import random_dag
from partitioner import Plan, partition
from partitioner.errors import HetpartError
from partitioner.report import render_html, timeline, write_pngs, write_report
from partitioner.report.layout import MAX_NODES, graph_layout
from partitioner.report.timeline import Bar, Timeline, producer_of

SVG_NS = "http://www.w3.org/2000/svg"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
EVIL_OP = 'lin"\'<script>alert(1)</script>'
EVIL_MODULE = 'blk."quoted".<script>alert(2)</script>'
EVIL_MODEL = "<script>alert(3)</script>"


# --------------------------------------------------------------------------------------------
# Plans
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_plan() -> Plan:
    """emb-transformer tiny on h200-host, the embedding pinned to the CPU (latency)."""
    m, x = models.get("emb-transformer", "tiny")
    return partition(m, x, "h200-host", pins={"emb": "cpu"})


@pytest.fixture(scope="module")
def streamed_plan() -> Plan:
    """gpt small with a 20 MB GPU: streamed weights, a shared-parameter copy, an activation copy."""
    m, x = models.get("gpt", "small")
    plan = partition(m, x, "h200-host", memory={"cuda:0": "20MB"})
    kinds = {t.kind for t in plan.transfers}
    assert {"weights", "param", "activation"} <= kinds, kinds
    return plan


@pytest.fixture(scope="module")
def makespan_plan() -> Plan:
    """two-branch small on two GPUs, devices running concurrently."""
    m, x = models.get("two-branch", "small")
    plan = partition(m, x, "2xh200-host", objective="makespan")
    assert {"cuda:0", "cuda:1"} <= set(plan.placement.values())
    return plan


@pytest.fixture(scope="module")
def throughput_plan() -> Plan:
    m, x = models.get("two-branch", "small")
    return partition(m, x, "h200-host", objective="throughput")


@pytest.fixture(scope="module")
def big_plan() -> Plan:
    """A bench-size synthetic graph: 1,000 ops."""
    plan = partition(random_dag(1, 1000, layers=50), devices="h200-host")
    assert plan.op_count == 1000
    return plan


def rename(plan: Plan, old: str, new: str) -> Plan:
    """The plan with every string (value or key) equal to ``old`` replaced by ``new``."""
    def walk(value: Any) -> Any:
        if isinstance(value, dict):
            return {(new if k == old else k): walk(v) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v) for v in value]
        return new if value == old else value
    return Plan.from_dict(walk(plan.to_dict()))


# --------------------------------------------------------------------------------------------
# Reading the page back
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Svg:
    cls: str
    attrs: dict[str, str]
    tags: list[tuple[str, dict[str, str]]] = dataclasses.field(default_factory=list)
    text: list[str] = dataclasses.field(default_factory=list)

    def find(self, tag: str, cls: str | None = None) -> list[dict[str, str]]:
        return [a for t, a in self.tags if t == tag and (cls is None or cls in a.get("class", "").split())]


class Page(HTMLParser):
    """Every tag with its attributes, the SVGs with what they hold, scripts and text."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str]]] = []
        self.svgs: list[Svg] = []
        self.scripts: list[str] = []
        self.text: list[str] = []
        self._svg: Svg | None = None
        self._script = False
        self.feed(text)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        self.tags.append((tag, a))
        if tag == "svg":
            self._svg = Svg(a.get("class", ""), a)
            self.svgs.append(self._svg)
        elif self._svg is not None:
            self._svg.tags.append((tag, a))
        if tag == "script":
            self._script = True
            self.scripts.append("")

    def handle_endtag(self, tag: str) -> None:
        if tag == "svg":
            self._svg = None
        if tag == "script":
            self._script = False

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        if self._svg is not None:
            self._svg.text.append(data)
        if self._script:
            self.scripts[-1] += data

    def svg(self, cls: str) -> Svg:
        found = [s for s in self.svgs if cls in s.cls.split()]
        assert len(found) == 1, f"expected one <svg class={cls!r}>, found {len(found)}"
        return found[0]


# --------------------------------------------------------------------------------------------
# Timeline
# --------------------------------------------------------------------------------------------

EPS = 1e-12


def assert_no_overlap(bars: tuple[Bar, ...] | list[Bar], what: str) -> None:
    ordered = sorted(bars, key=lambda b: b.start_s)
    for a, b in zip(ordered, ordered[1:]):
        assert a.end_s <= b.start_s + EPS, f"{what}: {a.name} [{a.start_s}, {a.end_s}] overlaps {b.name} [{b.start_s}]"


def op_bars(tl: Timeline) -> dict[str, Bar]:
    bars: dict[str, Bar] = {}
    for b in tl.bars:
        if b.kind == "op":
            assert b.name not in bars, f"op {b.name} has two bars"
            bars[b.name] = b
    return bars


def close_to(value: float, target: float) -> bool:
    return abs(value - target) <= max(0.01 * target, 5e-6)


def test_producer_of() -> None:
    ops = {"split": "cpu", "relu.x": "cpu"}
    assert producer_of("split", ops) == "split"
    assert producer_of("split.1", ops) == "split"
    assert producer_of("relu.x", ops) == "relu.x"
    assert producer_of("input_ids", ops) is None
    assert producer_of("other.0", ops) is None


@pytest.mark.parametrize("name", ["tiny_plan", "streamed_plan"])
def test_latency_timeline_is_one_sequential_clock(name: str, request: pytest.FixtureRequest) -> None:
    plan: Plan = request.getfixturevalue(name)
    tl = timeline(plan)
    bars = op_bars(tl)
    assert set(bars) == set(plan.placement)
    for op, bar in bars.items():
        assert bar.row == plan.placement[op] and bar.end_s >= bar.start_s
    for device in plan.devices.names():
        assert_no_overlap(tl.row_bars(device), device)
    # one clock: nothing on any device overlaps anything else on any device, or a blocking copy
    blocking = [b for b in tl.bars if b.row in plan.devices.names() or b.kind == "activation"]
    assert_no_overlap(blocking, "the sequential clock")
    assert [b.name for b in sorted(bars.values(), key=lambda b: b.start_s)] == list(plan.schedule)
    total = plan.predicted["total_s"]
    assert close_to(tl.end_s, total), (tl.end_s, total)
    assert set(tl.rows[:len(plan.devices.names())]) == set(plan.devices.names())


def test_latency_copies_sit_between_producer_and_consumer(streamed_plan: Plan) -> None:
    plan = streamed_plan
    tl = timeline(plan)
    bars = op_bars(tl)
    consumers: dict[str, list[str]] = {}
    for u, v in plan.edges:
        consumers.setdefault(u, []).append(v)
    copies = [b for b in tl.bars if b.kind == "activation"]
    assert copies and all(b.row == "cpu<->cuda:0" for b in copies)
    for b in copies:
        producer = producer_of(b.name, plan.placement)
        if producer is not None:
            assert b.start_s >= bars[producer].end_s - EPS
            for v in consumers.get(producer, ()):
                if plan.placement[v] == b.device:
                    assert b.end_s <= bars[v].start_s + EPS
    # prefetched weights run beside compute: back to back on the link from time 0
    weights = sorted((b for b in tl.bars if b.kind == "weights"), key=lambda b: b.start_s)
    assert len(weights) == sum(1 for t in plan.transfers if t.kind == "weights")
    assert weights[0].start_s == 0.0
    for a, b in zip(weights, weights[1:]):
        assert b.start_s == pytest.approx(a.end_s)
    assert [b.kind for b in tl.row_bars("cuda:0")].count("param") == 1


def test_sync_weights_come_just_before_their_op(streamed_plan: Plan) -> None:
    plan = dataclasses.replace(streamed_plan, stream_mode="sync")
    tl = timeline(plan)
    bars = op_bars(tl)
    weights = [b for b in tl.bars if b.kind == "weights"]
    assert weights
    for w in weights:
        assert w.end_s == pytest.approx(bars[w.name].start_s)
    assert_no_overlap([b for b in tl.bars if b.row in plan.devices.names() or b.kind != "op"],
                      "the sequential clock")
    # the copies now sit on the clock, and the prefetch issue latency leaves each streamed op
    streamed = [t for t in plan.transfers if t.kind == "weights"]
    issue = sum(link.latency for t in streamed for link in plan.devices.route(t.src, t.dst))
    extra = sum(t.seconds for t in streamed)
    assert tl.end_s == pytest.approx(timeline(streamed_plan).end_s + extra - issue)


def test_makespan_timeline_runs_devices_concurrently(makespan_plan: Plan) -> None:
    plan = makespan_plan
    tl = timeline(plan)
    bars = op_bars(tl)
    assert set(bars) == set(plan.placement)
    for device in plan.devices.names():
        assert_no_overlap(tl.row_bars(device), device)
    seconds = {(t.tensor, t.dst): t.seconds for t in plan.transfers if t.kind == "activation"}
    for u, v in plan.edges:
        ready = bars[u].end_s
        if plan.placement[u] != plan.placement[v]:
            ready += seconds[(u, plan.placement[v])]
        assert bars[v].start_s >= ready - 1e-12, f"{v} starts before its input from {u} arrives"
    gpu0 = [b for b in bars.values() if b.row == "cuda:0"]
    gpu1 = [b for b in bars.values() if b.row == "cuda:1"]
    assert any(a.start_s < b.end_s and b.start_s < a.end_s for a in gpu0 for b in gpu1), \
        "no op on cuda:0 runs while an op on cuda:1 does"
    assert close_to(tl.end_s, plan.predicted["total_s"]), (tl.end_s, plan.predicted["total_s"])


def test_throughput_timeline_is_back_to_back(throughput_plan: Plan) -> None:
    plan = throughput_plan
    tl = timeline(plan)
    for device in plan.devices.names():
        row = tl.row_bars(device)
        if row:
            assert row[0].start_s == 0.0
            for a, b in zip(row, row[1:]):
                assert b.start_s == pytest.approx(a.end_s)
    assert close_to(tl.end_s, plan.predicted["total_s"])


# --------------------------------------------------------------------------------------------
# The HTML page
# --------------------------------------------------------------------------------------------


def test_page_has_three_charts_and_no_urls(tiny_plan: Plan, tmp_path: Path) -> None:
    plan = tiny_plan
    path = write_report(plan, tmp_path / "report.html")
    text = path.read_text(encoding="utf-8")
    page = Page(text)
    gantt, memory, graph = page.svg("gantt"), page.svg("memory"), page.svg("graph")
    bars = memory.find("rect", "mem-bar")
    assert sorted(b["data-device"] for b in bars) == sorted(plan.devices.names())
    for b in bars:
        assert int(b["data-used"]) == plan.memory[b["data-device"]]["used"]
    rows = {a["data-row"]: a for a in gantt.find("g", "row")}
    for device in set(plan.placement.values()):
        assert device in rows
    for device in plan.devices.names():
        assert device in "".join(gantt.text)
    named = {a["data-name"] for a in gantt.find("rect", "bar")}
    assert set(plan.placement) <= named
    nodes = graph.find("g", "node")
    assert {a["data-op"] for a in nodes} == set(plan.placement)
    assert graph.attrs["data-coarsened"] == "false"
    urls = re.findall(r"https?://[^\s\"'<>]*", text)
    assert urls and set(urls) == {SVG_NS}, set(urls)
    for section in ("summary", "solver", "baselines", "transfers"):
        assert ("section", {"id": section}) in page.tags
    assert len(page.scripts) == 1 and "viewBox" in page.scripts[0]


def test_page_shows_cross_device_edges_and_link_rows(makespan_plan: Plan) -> None:
    plan = makespan_plan
    page = Page(render_html(plan))
    crossing = {(u, v) for u, v in plan.edges if plan.placement[u] != plan.placement[v]}
    edges = page.svg("graph").find("path", "edge")
    assert {(a["data-src"], a["data-dst"]) for a in edges if "cross" in a["class"].split()} == crossing
    assert crossing
    rows = [a["data-row"] for a in page.svg("gantt").find("g", "row")]
    assert rows[:3] == ["cpu", "cuda:0", "cuda:1"]
    assert "cuda:0<->cuda:1" in rows


def test_names_from_the_model_are_escaped(tiny_plan: Plan) -> None:
    victim = tiny_plan.schedule[3]
    plan = rename(tiny_plan, victim, EVIL_OP)
    plan = dataclasses.replace(plan, model_name=EVIL_MODEL,
                               modules={op: EVIL_MODULE for op in plan.modules})
    text = render_html(plan)
    assert "<script>alert" not in text
    assert '"quoted"' not in text
    page = Page(text)
    assert len(page.scripts) == 1
    assert EVIL_OP in {a["data-op"] for a in page.svg("graph").find("g", "node")}
    assert EVIL_OP in {a["data-name"] for a in page.svg("gantt").find("rect", "bar")}
    assert EVIL_MODULE in "".join(page.svg("gantt").text)
    assert EVIL_MODEL in "".join(page.text)


def test_big_graph_is_drawn_by_module_groups(big_plan: Plan) -> None:
    text = render_html(big_plan)
    assert len(text.encode("utf-8")) < 3_000_000
    page = Page(text)
    graph = page.svg("graph")
    assert graph.attrs["data-coarsened"] == "true"
    groups = graph.find("g", "node")
    assert 2 <= len(groups) <= MAX_NODES
    listed = [a for t, a in page.tags if t == "details" and "group" in a.get("class", "").split()]
    assert sorted(a["data-group"] for a in listed) == sorted(a["data-group"] for a in groups)
    layout = graph_layout(big_plan)
    assert sorted(op for n in layout.nodes for op in n.ops) == sorted(big_plan.placement)
    assert len(page.svg("gantt").find("rect", "bar")) >= 1000


def test_flat_modules_fall_back_to_schedule_chunks(big_plan: Plan) -> None:
    flat = dataclasses.replace(big_plan, modules={op: f"m{i}" for i, op in enumerate(big_plan.modules)})
    layout = graph_layout(flat)
    assert layout.coarsened and layout.depth == 0
    assert len(layout.nodes) <= MAX_NODES
    assert sum(len(n.ops) for n in layout.nodes) == 1000


# --------------------------------------------------------------------------------------------
# Files
# --------------------------------------------------------------------------------------------


def test_write_report_refuses_to_overwrite(tiny_plan: Plan, tmp_path: Path) -> None:
    path = tmp_path / "report.html"
    path.write_text("old")
    with pytest.raises(HetpartError, match=re.escape(f"{path} exists: pass --force to overwrite it")):
        write_report(tiny_plan, path)
    assert path.read_text() == "old"
    assert write_report(tiny_plan, path, force=True) == path
    assert path.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    assert os.listdir(tmp_path) == ["report.html"]


def test_write_pngs(streamed_plan: Plan, tmp_path: Path) -> None:
    folder = tmp_path / "charts"
    paths = write_pngs(streamed_plan, folder)
    assert [p.name for p in paths] == ["gantt.png", "memory.png"]
    for p in paths:
        data = p.read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 2000
    with pytest.raises(HetpartError, match="gantt.png exists: pass --force"):
        write_pngs(streamed_plan, folder)
    assert write_pngs(streamed_plan, folder, force=True) == paths
    assert sorted(os.listdir(folder)) == ["gantt.png", "memory.png"]


# --------------------------------------------------------------------------------------------
# In a real browser
# --------------------------------------------------------------------------------------------


def _chromium() -> str | None:
    return shutil.which("chromium") or (("/usr/bin/chromium") if os.path.exists("/usr/bin/chromium") else None)


@pytest.fixture()
def chromium() -> Iterator[str]:
    found = _chromium()
    if found is None:
        pytest.skip("chromium is not installed")
    yield found


@pytest.mark.browser
def test_report_renders_in_chromium(chromium: str, makespan_plan: Plan, tmp_path: Path) -> None:
    report = write_report(makespan_plan, tmp_path / "report.html")
    shot = tmp_path / "shot.png"
    cmd = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr", "--v=0",
           f"--screenshot={shot}", "--window-size=1280,2000", report.resolve().as_uri()]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    log = done.stdout + done.stderr
    assert shot.exists() and shot.stat().st_size > 0, f"no screenshot (exit {done.returncode}):\n{log[-2000:]}"
    import matplotlib.image

    pixels = matplotlib.image.imread(str(shot))
    assert pixels.shape[0] >= 1000 and pixels.std() > 0.02, "the screenshot is blank"
    console = [line for line in log.splitlines() if "CONSOLE" in line or "Uncaught" in line]
    assert not console, "the page logged to the console:\n" + "\n".join(console)
