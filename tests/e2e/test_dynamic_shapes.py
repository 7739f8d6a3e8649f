"""A plan made for one input size serves the sizes declared dynamic, and says so for the others.

GPT-2-like (the zoo's ``gpt``) with a dynamic batch and sequence, resnet-like (the zoo's
``convnet``) with a dynamic batch: each planned over three devices at its example size, then its
emitted module run at three other sizes against eager; an undeclared size fails with a sentence
naming the input and the planned shape.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

import models
from partitioner import CaptureError, HetpartError, Plan, partition
from partitioner.cli import main

BIND = {"cuda:0": "cpu", "npu:0": "cpu"}


def _eager_equal(model: torch.nn.Module, emitted: torch.nn.Module, x: torch.Tensor) -> None:
    with torch.no_grad():
        torch.testing.assert_close(emitted(x), model(x))


def test_gpt_with_a_dynamic_batch_and_sequence_runs_other_sizes(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model, (tokens,) = models.get("gpt", "tiny")
    assert tuple(tokens.shape) == (2, 16)
    plan = partition(model, (tokens,), "cpu-gpu-npu", dynamic_shapes=("batch", "seq"), time_limit=10,
                     pins={"blocks.0*": "cuda:0", "blocks.1*": "npu:0"})
    assert len(set(plan.placement.values())) == 3
    plan = Plan.load(plan.save(tmp_path / "gpt.json"))
    (spec,) = plan.inputs
    assert spec.shape == (2, 16) and spec.dynamic_names() == {0: "batch", 1: "seq"}
    assert spec.dynamic[1][2] == 16, "torch.export proved the sequence cannot exceed the position table"
    emitted = plan.emit(model, BIND)
    for shape in ((1, 8), (3, 16), (5, 3)):
        _eager_equal(model, emitted, torch.randint(0, 128, shape))
    with pytest.raises(HetpartError, match=r"input 0 \(input_ids\) has shape \(2, 17\): dimension 1 \(seq\) is 17, "
                                           r"outside the sizes the plan runs \(1 to 16\) for int64\[batch=2, seq=16\]"):
        emitted(torch.randint(0, 128, (2, 17)))
    path = plan.emit_source(tmp_path / "gpt_placed.py", model, BIND)  # the file runs the other sizes too
    spec_ = importlib.util.spec_from_file_location("gpt_placed", path)
    module = importlib.util.module_from_spec(spec_)
    spec_.loader.exec_module(module)
    placed = module.build(model)
    for shape in ((1, 8), (4, 12)):
        _eager_equal(model, placed, torch.randint(0, 128, shape))


def test_a_static_plan_names_the_input_and_the_planned_shape() -> None:
    model, (tokens,) = models.get("gpt", "tiny")
    emitted = partition(model, (tokens,), "cpu", time_limit=10).emit(model)
    with pytest.raises(HetpartError, match=r"input 0 \(input_ids\) has shape \(2, 12\), and the plan was made for "
                                           r"int64\[2, 16\]: dimension 1 is fixed at 16; re-plan with that dimension "
                                           r"declared dynamic \(--dynamic seq"):
        emitted(torch.randint(0, 128, (2, 12)))


def test_convnet_with_a_dynamic_batch_runs_other_batches() -> None:
    torch.manual_seed(0)
    model, (images,) = models.get("convnet", "tiny")
    plan = partition(model, (images,), "cpu-gpu-npu", dynamic_shapes={"batch": 0}, time_limit=10,
                     pins={"stem*": "cuda:0"})
    assert len(set(plan.placement.values())) >= 2
    emitted = plan.emit(model, BIND)
    for batch in (1, 3, 7):
        _eager_equal(model, emitted, torch.randn(batch, 3, 32, 32))
    with pytest.raises(HetpartError, match=r"input 0 \(x\) has shape \(2, 3, 30, 32\), and the plan was made for "
                                           r"float32\[batch=2, 3, 32, 32\]: dimension 2 is fixed at 32"):
        emitted(torch.randn(2, 3, 30, 32))


def test_the_cli_records_dynamic_dimensions(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "plan.json"
    assert main(["plan", "gpt", "--devices", "cpu", "--dynamic", "batch,seq", "--time-limit", "10",
                 "-o", str(path)]) == 0
    (entry,) = json.loads(path.read_text())["model"]["inputs"]
    assert entry["dynamic"] == {"0": {"name": "batch", "min": 1, "max": None},
                                "1": {"name": "seq", "min": 1, "max": 16}}
    capsys.readouterr()
    assert main(["plan", "gpt", "--dynamic", "width"]) == 2
    assert "--dynamic 'width': 'width' is not batch or seq; say which dimension it is with NAME=DIM, e.g. width=2" \
        in capsys.readouterr().err


def test_a_dimension_the_model_fixes_cannot_be_declared_dynamic() -> None:
    class Fixed(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.reshape(2, 8) * 2  # needs exactly 16 elements

    with pytest.raises(CaptureError, match=r"dimension 0 of input 0 \(batch, size 2\) cannot vary: torch.export had "
                                           r"to fix it"):
        partition(Fixed(), (torch.randn(2, 8),), "cpu", dynamic_shapes=("batch",))
