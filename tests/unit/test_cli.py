"""The hetpart CLI: inspect and devices, and the errors a user meets with bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from partitioner.cli import main

ROOT = Path(__file__).resolve().parents[2]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_inspect_prints_totals_and_a_cost_table(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "inspect", "gpt", "--devices", "h200-host", "--top", "5")
    assert code == 0
    assert "model     gpt:tiny" in out and "FLOPs" in out and "params" in out
    assert "the 5 most expensive ops" in out
    header = next(line for line in out.splitlines() if line.strip().startswith("op "))
    assert "cpu" in header and "cuda:0" in header


def test_inspect_json_has_one_row_per_op_and_both_devices(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "inspect", "mlp:tiny", "--json", "--top", "0")
    assert code == 0
    data = json.loads(out)
    assert data["op_count"] == len(data["rows"]) > 0
    assert set(data["total_seconds"]) == {"cpu", "cuda:0"}
    assert all(set(r["seconds"]) == {"cpu", "cuda:0"} for r in data["rows"])


def test_inspect_training_costs_more_than_forward(capsys: pytest.CaptureFixture[str]) -> None:
    _, fwd, _ = run(capsys, "inspect", "mlp", "--json")
    _, train, _ = run(capsys, "inspect", "mlp", "--json", "--training", "--optimizer", "adam")
    fwd_data, train_data = json.loads(fwd), json.loads(train)
    assert train_data["training"] and train_data["memory_bytes"] == 4 * train_data["trainable_bytes"]
    for device, seconds in fwd_data["total_seconds"].items():
        assert train_data["total_seconds"][device] > 2 * seconds


def test_inspect_marks_ops_a_device_cannot_run(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "inspect", "emb-transformer", "--devices", "cpu-gpu-npu", "--json", "--top", "0")
    assert code == 0
    data = json.loads(out)
    gathers = [r for r in data["rows"] if r["op_class"] == "gather"]
    assert gathers and all(r["seconds"]["npu:0"] is None for r in gathers)
    assert data["total_seconds"]["npu:0"] is None


def test_unknown_model_is_one_clear_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "inspect", "gtp")
    assert code == 2
    assert err.startswith("hetpart: error: unknown model 'gtp'") and "did you mean 'gpt'" in err
    assert "Traceback" not in err


def test_model_file_factory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "mymodel.py"
    src.write_text(
        "import torch\n"
        "def build():\n"
        "    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()), (torch.randn(2, 4),)\n"
    )
    code, out, _ = run(capsys, "inspect", f"{src}:build", "--devices", "cpu")
    assert code == 0 and "mymodel:build" in out
    code, _, err = run(capsys, "inspect", f"{src}:missing")
    assert code == 2 and "has no function 'missing'" in err and "build" in err
    code, _, err = run(capsys, "inspect", f"{tmp_path / 'nope.py'}:build")
    assert code == 2 and "does not exist" in err


def test_a_model_that_fails_to_trace_names_the_capture_and_suggests_the_other(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "branchy.py"
    src.write_text(
        "import torch\n"
        "class Branchy(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        return x * 2 if x.sum() > 0 else x\n"
        "def build():\n"
        "    return Branchy(), (torch.randn(3),)\n"
    )
    code, _, err = run(capsys, "inspect", f"{src}:build", "--capture", "symbolic_trace")
    assert code == 2 and "symbolic_trace could not trace Branchy" in err and "--capture export" in err
    assert "Traceback" not in err


def test_debug_shows_the_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    from partitioner.errors import UnknownModel

    with pytest.raises(UnknownModel):
        main(["inspect", "gtp", "--debug"])


def test_bad_profile_files_name_the_file_and_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    zero = tmp_path / "zero.toml"
    zero.write_text(
        '[devices.cpu]\nkind = "cpu"\nmemory = 0\npeak_flops = { float32 = 1e12 }\n'
        'mem_bandwidth = "20GB/s"\nlaunch_overhead = "2us"\n'
    )
    code, _, err = run(capsys, "inspect", "mlp", "--devices", str(zero))
    assert code == 2 and "zero.toml" in err and "zero memory" in err
    unit = tmp_path / "unit.toml"
    unit.write_text(zero.read_text().replace("memory = 0", 'memory = "64 gigs"'))
    code, _, err = run(capsys, "inspect", "mlp", "--devices", str(unit))
    assert code == 2 and "unit.toml" in err and "memory" in err and "64 gigs" in err
    missing = tmp_path / "missing.toml"
    missing.write_text(zero.read_text().replace('mem_bandwidth = "20GB/s"\n', "").replace("memory = 0", 'memory = "1GB"'))
    code, _, err = run(capsys, "inspect", "mlp", "--devices", str(missing))
    assert code == 2 and "missing.toml" in err and "mem_bandwidth" in err
    code, _, err = run(capsys, "inspect", "mlp", "--devices", "h300-host")
    assert code == 2 and "h200-host" in err


def test_devices_lists_and_shows_profiles(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "devices")
    assert code == 0
    for name in ("cpu", "h200-host", "a100-host", "cpu-gpu-npu", "2xh200-host"):
        assert name in out
    code, out, _ = run(capsys, "devices", "2xh200-host")
    assert code == 0 and "cuda:1" in out and "cuda:0 <-> cuda:1" in out


def test_devices_detect_writes_a_profile_that_loads_back(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from partitioner import load_profile

    target = tmp_path / "local.toml"
    code, out, _ = run(capsys, "devices", "--detect", "--no-measure", "--write", str(target))
    assert code == 0 and target.exists() and "cpu" in out
    assert "cpu" in load_profile(str(target)).names()
    code, _, err = run(capsys, "devices", "--detect", "--no-measure", "--write", str(target))
    assert code == 2 and "--force" in err
    code, _, _ = run(capsys, "devices", "--detect", "--no-measure", "--write", str(target), "--force")
    assert code == 0


def test_console_script_runs_as_a_module() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "partitioner.cli", "devices"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and "h200-host" in done.stdout


def test_plan_prints_a_summary_and_writes_a_plan_that_loads(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from partitioner import Plan

    target = tmp_path / "plan.json"
    code, out, err = run(capsys, "plan", "emb-transformer", "--devices", "h200-host", "--memory", "cuda:0=100KB",
                         "--pin", "head=cuda:0", "-o", str(target))
    assert code == 0, err
    assert "plan for 'emb-transformer:tiny'" in out and "solver     ilp:" in out
    assert "baseline greedy" in out and "speed-up" in out and "lower bound" in out
    plan = Plan.load(target)
    assert plan.memory["cuda:0"]["capacity"] == 100_000 and plan.memory["cuda:0"]["used"] <= 100_000
    assert {plan.placement[op] for op, path in plan.modules.items() if path == "head"} == {"cuda:0"}
    code, _, err = run(capsys, "plan", "mlp", "-o", str(target))
    assert code == 2 and "--force" in err


def test_plan_bad_flags_are_clear(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "plan", "mlp", "--memory", "cuda:0")
    assert code == 2 and "expected KEY=VALUE" in err
    code, _, err = run(capsys, "plan", "mlp", "--memory", "cuda:0=lots")
    assert code == 2 and "lots" in err
    code, _, err = run(capsys, "plan", "mlp", "--solver", "gurobi")
    assert code == 2 and "unknown ILP solver 'gurobi'" in err
    code, _, err = run(capsys, "plan", "mlp", "--memory", "cpu=1KB", "--memory", "cuda:0=1KB")
    assert code == 2 and "no placement fits" in err


def test_plan_with_a_baseline_solver_and_makespan(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "plan", "two-branch", "--devices", "2xh200-host", "--objective", "makespan",
                       "--solver", "heft")
    assert code == 0 and "solver     heft: heuristic" in out
