"""report, explain, plan --format, and the bad input they meet."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from partitioner.cli import main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def plan_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    path = tmp_path / "plan.json"
    code, _, err = run(capsys, "plan", "emb-transformer", "--pin", "emb=cpu", "--pin", "layers*=cuda:0",
                       "-o", str(path))
    assert code == 0, err
    return path


def test_report_html_and_png(plan_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    html = tmp_path / "r.html"
    code, out, _ = run(capsys, "report", str(plan_file), "-o", str(html))
    assert code == 0 and html.exists() and "<svg" in html.read_text()
    code, _, err = run(capsys, "report", str(plan_file), "-o", str(html))
    assert code == 2 and "--force" in err
    code, out, _ = run(capsys, "report", str(plan_file), "--format", "png", "-o", str(tmp_path / "png"))
    assert code == 0 and (tmp_path / "png" / "gantt.png").read_bytes()[:4] == b"\x89PNG"


def test_report_emit_and_check_reject_a_plan_for_another_model(plan_file: Path, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    fingerprint = json.loads(plan_file.read_text())["model"]["fingerprint"]
    for argv in (["report", str(plan_file), "-o", str(tmp_path / "x.html"), "--model", "gpt"],
                 ["emit", "gpt", "--plan", str(plan_file), "-o", str(tmp_path / "x.py"), "--bind", "cuda:0=cpu"],
                 ["check", "gpt", "--plan", str(plan_file), "--bind", "cuda:0=cpu"]):
        code, _, err = run(capsys, *argv)
        assert code == 2, argv
        assert fingerprint in err and err.count("fingerprint") >= 2, err


def test_explain_an_op_and_a_module(plan_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "explain", str(plan_file), "emb")
    assert code == 0 and "emb: 1 op(s) on cpu" in out and "pinned" in out and "<- chosen" in out
    code, out, _ = run(capsys, "explain", str(plan_file), "layers.0")
    assert code == 0 and "on cuda:0" in out and "cpu" in out
    code, _, err = run(capsys, "explain", str(plan_file), "nope")
    assert code == 2 and "no op or module 'nope'" in err and "emb" in err


def test_plan_exports_device_map_and_csv(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dm = tmp_path / "map.json"
    code, _, err = run(capsys, "plan", "gpt", "--pin", "blocks.1*=cuda:0", "--align-modules", "Block",
                       "--format", "device-map", "-o", str(dm))
    assert code == 0, err
    device_map = json.loads(dm.read_text())
    assert device_map["blocks.1"] == "cuda:0" and device_map["blocks.0"] == "cpu"
    table = tmp_path / "ops.csv"
    code, _, _ = run(capsys, "plan", "gpt", "--format", "csv", "-o", str(table))
    rows = list(csv.DictReader(io.StringIO(table.read_text())))
    assert code == 0 and rows and set(rows[0]) == {"op", "module", "device", "weights", "predicted_s"}
    code, _, err = run(capsys, "plan", "gpt", "--format", "csv")
    assert code == 2 and "-o FILE" in err


def test_truncated_and_hand_edited_plans_name_the_field(plan_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = plan_file.read_text()
    plan_file.write_text(text[: len(text) // 2])
    code, _, err = run(capsys, "explain", str(plan_file), "emb")
    assert code == 2 and "truncated" in err
    data = json.loads(text)
    data["solver"]["gap"] = "tiny"
    plan_file.write_text(json.dumps(data))
    code, _, err = run(capsys, "report", str(plan_file), "-o", str(plan_file.with_suffix(".html")))
    assert code == 2 and "solver.gap" in err
