"""``hetpart check``: strict devices on three logical devices bound to the CPU, and the verdict.

``--strict-devices`` binds ``cpu``, ``cuda:0`` and ``npu:0`` each to its own CPU tag and prints the
copies per link and the bytes resident per device; they must equal the plan's transfers and
parameter bytes. The verdict needs every compared tensor: a check whose only wrong tensor is one
gradient, or the loss, fails.
"""

from __future__ import annotations

import collections
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

import models
from backends.strict_devices import Site, StrictDevices
from partitioner import Plan
from partitioner.cli import main
from partitioner.errors import DeviceMismatch

PINS = ["--pin", "blocks.0*=cuda:0", "--pin", "blocks.1*=npu:0"]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """gpt:tiny on cpu-gpu-npu with one block on each accelerator: three logical devices."""
    path = tmp_path_factory.mktemp("plans") / "three.json"
    assert main(["plan", "gpt", "--devices", "cpu-gpu-npu", *PINS, "--no-streaming", "-o", str(path)]) == 0
    assert set(Plan.load(path).placement.values()) == {"cpu", "cuda:0", "npu:0"}
    return path


def _rows(out: str, header: str) -> dict[str, list[str]]:
    """The rows of the table whose header line starts with ``header``, keyed by their first cell."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith(header))
    rows = {}
    for line in lines[start + 1:]:
        cells = re.split(r"\s{2,}", line.strip())
        if not line.startswith("  ") or not re.fullmatch(r"[\w:]+(->[\w:]+)?", cells[0]) or not cells[1][0].isdigit():
            break
        rows[cells[0]] = cells[1:]
    return rows


def test_strict_devices_report_the_plans_copies_and_resident_bytes(
        plan_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "check", "gpt", "--plan", str(plan_file), "--strict-devices", "--repeat", "1")
    assert code == 0, out + err
    assert "cpu->cpu:1, cuda:0->cpu:2, npu:0->cpu:3" in out
    plan = Plan.load(plan_file)

    links = _rows(out, "link")
    expected: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    for t in plan.transfers:
        expected[f"{t.src}->{t.dst}"][0] += 1
        expected[f"{t.src}->{t.dst}"][1] += t.bytes
    assert len(expected) >= 3, "copies cross between all three devices"
    assert {link: [int(c[0]), int(c[1].replace(",", ""))] for link, c in links.items()} == dict(expected)

    devices = _rows(out, "device")
    resident = {d: int(c[0].replace(",", "")) for d, c in devices.items()}
    owned: dict[str, int] = collections.defaultdict(int)
    for op in plan.param_ops:
        owned[plan.weights.get(op, plan.placement[op])] += plan.op_bytes[op][1]
    assert resident == dict(owned)
    model, _ = models.get("gpt", "tiny")
    state = {id(t): t for t in [*model.parameters(), *model.buffers()]}.values()
    assert sum(resident.values()) == sum(t.numel() * t.element_size() for t in state)
    assert all(c[-1] == "ok" for c in [*links.values(), *devices.values()])
    assert out.rstrip().splitlines()[-1] == "passed: every tensor within its tolerance; copies and resident bytes as the plan says"


def test_strict_devices_refuse_a_binding(plan_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "check", "gpt", "--plan", str(plan_file), "--strict-devices", "--bind", "cuda:0=cpu")
    assert code == 2 and "--strict-devices binds every device" in err and "drop --bind" in err


def emitting_with(monkeypatch: pytest.MonkeyPatch, change: Callable[[torch.nn.Module], object]) -> None:
    """Every ``plan.emit`` from now on returns its module after ``change`` (the bug under test)."""
    emit = Plan.emit

    def changed(self: Plan, *args: object, **kwargs: object) -> torch.nn.Module:
        module = emit(self, *args, **kwargs)
        change(module)
        return module

    monkeypatch.setattr(Plan, "emit", changed)


def test_a_gradient_only_error_fails_the_check(plan_file: Path, capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    emitting_with(monkeypatch, lambda m: m.get_parameter("blocks.1.mlp.ff1.weight").register_hook(lambda g: g * 1.01))
    code, out, _ = run(capsys, "check", "gpt", "--plan", str(plan_file), "--training", "--strict-devices",
                       "--repeat", "1")
    assert code == 1
    failed = [line.split()[0] for line in out.splitlines() if line.rstrip().endswith("FAIL")]
    assert failed == ["blocks.1.mlp.ff1.weight"], out
    assert out.rstrip().splitlines()[-1].startswith("FAILED: 1 of ")


def test_a_loss_only_error_fails_the_check(plan_file: Path, capsys: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Every output within its tolerance, their sum not: 0.9 atol on each of 4,096 logits."""
    emitting_with(monkeypatch, lambda m: m.register_forward_hook(lambda _m, _inputs, output: output + 0.9e-5))
    code, out, _ = run(capsys, "check", "gpt", "--plan", str(plan_file), "--training", "--repeat", "1",
                       "--bind", "cuda:0=cpu", "--bind", "npu:0=cpu")
    assert code == 1
    failed = [line.split()[0] for line in out.splitlines() if "FAIL" in line and line.startswith("  ")]
    assert failed == ["loss"], out
    output = next(line for line in out.splitlines() if line.strip().startswith("output"))
    assert output.rstrip().endswith("ok")


# -- the mode itself -------------------------------------------------------------------------


def test_a_host_scalar_meets_any_device_but_a_host_vector_does_not() -> None:
    mode = StrictDevices(["cpu", "cuda:0"], host="cpu")
    with mode:
        x = torch.ones(3).to(mode.binding["cuda:0"])
        y = x * torch.tensor(2.0)  # a 0-dim CPU tensor: torch allows it beside CUDA tensors
        assert mode.device_of(y) == "cuda:0"
        with pytest.raises(DeviceMismatch, match=r"reads .* on cuda:0 and .* on cpu"):
            x + torch.ones(3)
    assert [(c.src, c.dst, c.bytes) for c in mode.copies] == [("cpu", "cuda:0", 12)]


def test_a_factory_away_from_its_planned_device_fails() -> None:
    mode = StrictDevices(["cpu", "cuda:0"], host="cpu", planned={"arange": "cuda:0"})

    def program() -> torch.Tensor:
        return torch.arange(4, device="cpu")  # the device the capture saw, never rebound

    code = program.__code__
    mode.watch(code, {code.co_firstlineno + 1: Site(op="arange", call="aten::arange")})
    with mode, pytest.raises(DeviceMismatch, match=r"op arange \(aten\.arange\) is planned on cuda:0 but creates"):
        program()

