"""`hetpart demo` on its built-in defaults, in a temporary folder: files, plan invariants, check."""

from __future__ import annotations

import json
import os
from html.parser import HTMLParser
from pathlib import Path

import pytest

from partitioner import Plan
from partitioner.cli import main


class _Svgs(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.classes: list[str] = []

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag == "svg":
            self.classes.extend((dict(attrs).get("class") or "").split())


def test_demo_writes_plan_source_and_report_and_the_check_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        code = main(["demo"])
    finally:
        os.chdir(cwd)
    out, err = capsys.readouterr()
    assert code == 0, out + err
    folder = tmp_path / "hetpart-demo"
    plan = Plan.load(folder / "plan.json")
    # the plan's invariants: every op placed on a device of the profile, memory within capacity
    assert plan.op_count == len(plan.placement) == 162
    assert set(plan.placement.values()) <= set(plan.devices.names())
    for device, mem in plan.memory.items():
        assert mem["used"] <= mem["capacity"], device
    assert plan.memory["cuda:0"]["capacity"] == 4_496_539_680
    assert plan.solver.status in ("optimal", "within gap") and plan.solver.gap <= 0.01
    for b in plan.baselines.values():
        if b.feasible:
            assert plan.predicted["total_s"] <= b.total_s
    assert "passed: every tensor within its tolerance" in out
    assert "greedy" in out and "speed-up" in out and "hetpart-demo/report.html" in out
    assert "[" in err and "planning" in err  # progress while capturing, solving, checking
    parser = _Svgs()
    parser.feed((folder / "report.html").read_text())
    assert {"gantt", "memory", "graph"} <= set(parser.classes)
    source = (folder / "partitioned.py").read_text()
    assert "class PartitionedModel" in source and ".to(" in source
    assert json.loads((folder / "plan.json").read_text())["format_version"] == 1
    # a second run does not overwrite without --force
    os.chdir(tmp_path)
    try:
        assert main(["demo"]) == 2
    finally:
        os.chdir(cwd)
    assert "--force" in capsys.readouterr().err
