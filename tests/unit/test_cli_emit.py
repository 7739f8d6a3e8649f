"""``hetpart emit`` and ``hetpart check`` end to end on the CPU, and the comparison behind check.

A two-device plan for ``gpt`` (``blocks.0`` pinned to ``cuda:0``) is made once; every test binds
``cuda:0`` to the CPU, as a CPU-only machine must.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

import models
from backends.compare import TOLERANCES, compare, tolerance_for
from partitioner import Plan
from partitioner.cli import main


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def plans(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``gpt`` with blocks.0 pinned to cuda:0, and a plain ``mlp`` plan (for the mismatch)."""
    folder = tmp_path_factory.mktemp("plans")
    out = {"gpt": folder / "p.json", "mlp": folder / "mlp.json"}
    assert main(["plan", "gpt", "--pin", "blocks.0*=cuda:0", "-o", str(out["gpt"])]) == 0
    assert main(["plan", "mlp", "-o", str(out["mlp"])]) == 0
    assert "cuda:0" in Plan.load(out["gpt"]).placement.values()
    return out


# -- check -----------------------------------------------------------------------------------


def test_check_bound_to_cpu_passes_and_prints_errors_and_times(
        plans: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "check", "gpt", "--plan", str(plans["gpt"]), "--bind", "cuda:0=cpu", "--repeat", "2")
    assert code == 0, err
    assert "cuda:0->cpu" in out and "inference" in out
    row = next(line for line in out.splitlines() if line.strip().startswith("output"))
    assert "float32" in row and row.rstrip().endswith("ok")
    assert "max abs" in out and "max rel" in out
    assert "time (forward, median of 2): original" in out and "emitted" in out
    assert out.rstrip().splitlines()[-1].startswith("passed")


def test_check_training_compares_loss_and_every_gradient(
        plans: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "check", "gpt", "--plan", str(plans["gpt"]), "--bind", "cuda:0=cpu",
                         "--training", "--repeat", "1")
    assert code == 0, err
    names = {line.split()[0] for line in out.splitlines()[2:] if line.startswith("  ") and line.split()}
    model, _ = models.get("gpt", "tiny")
    assert "loss" in names
    assert {name for name, _ in model.named_parameters()} <= names
    assert "forward + backward" in out


def test_check_fails_with_exit_1_when_the_emitted_module_differs(
        plans: dict[str, Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    emit = Plan.emit

    def perturbed(self: Plan, *args: object, **kwargs: object) -> torch.nn.Module:
        module = emit(self, *args, **kwargs)
        module.register_forward_hook(lambda _m, _inputs, output: output + 1e-3)
        return module

    monkeypatch.setattr(Plan, "emit", perturbed)
    code, out, _ = run(capsys, "check", "gpt", "--plan", str(plans["gpt"]), "--bind", "cuda:0=cpu", "--repeat", "1")
    assert code == 1
    assert "FAIL" in out and out.rstrip().splitlines()[-1].startswith("FAILED: 1 of 1 tensors")


def test_check_without_bind_suggests_one(plans: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    if torch.cuda.is_available():
        pytest.skip("cuda:0 is present: the plan runs without a binding")
    code, _, err = run(capsys, "check", "gpt", "--plan", str(plans["gpt"]))
    assert code == 2
    assert "cuda:0" in err and "not present" in err and "--bind cuda:0=cpu" in err
    assert "Traceback" not in err


def test_plan_for_another_model_names_both_fingerprints(
        plans: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "check", "gpt", "--plan", str(plans["mlp"]), "--bind", "cuda:0=cpu")
    assert code == 2
    mlp_fp = json.loads(plans["mlp"].read_text())["model"]["fingerprint"]
    gpt_fp = json.loads(plans["gpt"].read_text())["model"]["fingerprint"]
    assert mlp_fp != gpt_fp
    assert mlp_fp in err and gpt_fp in err
    assert "'gpt:tiny'" in err and "'mlp:tiny'" in err


@pytest.mark.parametrize(("argv", "message"), [
    (["--bind", "cuda0cpu"], "expected KEY=VALUE, e.g. --bind cuda:0=cpu"),
    (["--bind", "gpu:0=cpu"], "names gpu:0, which the plan's profile does not have"),
])
def test_bad_bind_is_one_clear_line(plans: dict[str, Path], capsys: pytest.CaptureFixture[str],
                                    argv: list[str], message: str) -> None:
    code, _, err = run(capsys, "check", "gpt", "--plan", str(plans["gpt"]), *argv)
    assert code == 2 and message in err and "Traceback" not in err


def test_missing_plan_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "check", "gpt", "--plan", str(tmp_path / "nope.json"), "--bind", "cuda:0=cpu")
    assert code == 2 and "no such plan file" in err and "hetpart plan" in err


# -- emit ------------------------------------------------------------------------------------


def _import(path: Path) -> object:
    spec = importlib.util.spec_from_file_location(f"_emitted_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules.pop(spec.name, None)
    return module


def test_emit_writes_a_file_that_imports_and_runs(
        plans: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "out.py"
    code, out, err = run(capsys, "emit", "gpt", "--plan", str(plans["gpt"]), "-o", str(target), "--bind", "cuda:0=cpu")
    assert code == 0, err
    assert f"wrote {target}" in out
    assert "gpt:tiny" in out and "cuda:0" in out and "(bound to cpu)" in out
    model, inputs = models.get("gpt", "tiny")
    placed = _import(target).build(model)
    with torch.no_grad():
        torch.testing.assert_close(placed(*inputs), model(*inputs))


def test_emit_refuses_to_overwrite_without_force(
        plans: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "out.py"
    target.write_text("# mine\n")
    args = ["emit", "gpt", "--plan", str(plans["gpt"]), "-o", str(target), "--bind", "cuda:0=cpu"]
    code, _, err = run(capsys, *args)
    assert code == 2 and "exists" in err and "--force" in err
    assert target.read_text() == "# mine\n"
    code, _, err = run(capsys, *args, "--force")
    assert code == 0, err
    assert "class PartitionedModel" in target.read_text()


# -- the comparison --------------------------------------------------------------------------


def test_tolerances_by_dtype() -> None:
    assert tolerance_for(torch.float32) == TOLERANCES[torch.float32]
    assert (tolerance_for(torch.float32).rtol, tolerance_for(torch.float32).atol) == (1e-4, 1e-5)
    assert tolerance_for(torch.bfloat16).rtol > tolerance_for(torch.float16).rtol > tolerance_for(torch.float32).rtol
    assert (tolerance_for(torch.int64).rtol, tolerance_for(torch.int64).atol) == (0.0, 0.0)


def test_compare_holds_each_dtype_to_its_tolerance() -> None:
    ref = torch.linspace(1, 2, 100)
    assert compare("x", ref * (1 + 5e-5), ref).passed
    bad = compare("x", ref * (1 + 1e-3), ref)
    assert not bad.passed and bad.max_abs == pytest.approx(2e-3, rel=1e-3)
    assert bad.max_rel == pytest.approx(1e-3, rel=1e-3)
    assert compare("x", (ref * (1 + 5e-3)).bfloat16(), ref.bfloat16()).passed
    ints = torch.arange(10)
    assert compare("i", ints.clone(), ints).passed
    assert not compare("i", ints + torch.eye(10, dtype=torch.int64)[0], ints).passed
    assert not compare("x", ref[:50], ref).passed and "shape" in compare("x", ref[:50], ref).note
    assert not compare("x", ref.double(), ref).passed
    assert not compare("x", torch.full_like(ref, float("nan")), ref).passed
