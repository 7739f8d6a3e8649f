"""``hetpart explain``: whether a module's weights fit each device, streamed weights counted as they are held."""

from __future__ import annotations

import pytest
import torch

import models
from partitioner import partition
from partitioner.cli import main
from partitioner.explain import explain
from partitioner.plan import Plan


@pytest.fixture(scope="module")
def streamed_plan() -> Plan:
    """gpt:tiny pinned to an 80 KB cuda:0: it fits there only by streaming most linears' weights."""
    torch.manual_seed(0)
    model, inputs = models.get("gpt", "tiny")
    plan = partition(model, inputs, "cpu-gpu-npu", memory={"cuda:0": "80KB"}, pins={"*": "cuda:0"}, time_limit=10)
    assert any(plan.modules[op].startswith("blocks.0.") for op in plan.weights)
    return plan


def test_the_chosen_device_fits_when_streaming_makes_it_fit(streamed_plan: Plan, tmp_path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    plan = streamed_plan
    block = explain(plan, "blocks.0")
    assert block.streamed > 0 and block.param_bytes > plan.memory["cuda:0"]["capacity"] - plan.memory["cuda:0"]["used"]
    chosen = {o.device: o for o in block.options}["cuda:0"]
    assert chosen.chosen and chosen.fits  # its streamed weights take stream buffers there, not their size
    path = plan.save(tmp_path / "plan.json")
    assert main(["explain", str(path), "blocks.0"]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.strip().startswith("cuda:0"))
    assert line.endswith("fits  <- chosen"), line


def test_a_device_without_room_for_the_weights_does_not_fit(streamed_plan: Plan) -> None:
    """Moving a streamed op's weights onto a full device is still called out; its host still fits."""
    plan = streamed_plan
    op = next(op for op in plan.weights if plan.op_bytes[op][1] > 0)
    tight = Plan.from_dict({**plan.to_dict(), "devices": plan.devices.with_memory(
        {"npu:0": plan.op_bytes[op][1] // 2}).to_dict(),
        "memory": {**plan.to_dict()["memory"],
                   "npu:0": {"used": 0, "capacity": plan.op_bytes[op][1] // 2}}}, "tight.json")
    options = {o.device: o for o in explain(tight, op).options}
    assert options["cuda:0"].fits and options["cuda:0"].chosen
    assert options["cpu"].fits            # its weights already live there
    assert not options["npu:0"].fits      # half its weights' size: they cannot sit there
