"""End to end: a plan with fallbacks, emitted with ``emit_live``, follows the memory its probe reports.

The plan is ``mlp:small`` on ``detect:h200-host`` with ``cuda:0`` capped where the whole model just
fits, and fallbacks at 0.6 and 0.3 of it (which stream weights or move layers to the CPU). The
probe is a stand-in reporting shrinking (then growing) free memory on ``cuda:0``; every logical
device is bound to the CPU. The module must switch to the plan that fits, log each switch once,
give the original model's outputs under every plan, and with no plan fitting raise before any op runs.
"""

from __future__ import annotations

import logging

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import models
from backends.torch import emit_live
from backends.torch.live import LiveModule
from cost_models.units import format_bytes
from partitioner import Plan, partition
from partitioner.errors import HetpartError, NoPlanFits

CAP = 26_000_000
FRACTIONS = (0.6, 0.3)
BIND = {"cuda:0": "cpu"}


class OpCounter(TorchDispatchMode):
    """Counts every aten op dispatched while it is active."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.fixture(scope="module")
def model_and_plan() -> tuple[torch.nn.Module, tuple, Plan]:
    torch.manual_seed(0)
    module, inputs = models.get("mlp", "small")
    plan = partition(module, inputs, "detect:h200-host", memory={"cuda:0": CAP}, fallbacks=FRACTIONS, time_limit=20)
    return module, inputs, plan


def needs(plan: Plan) -> list[int]:
    return [p.memory["cuda:0"]["used"] for p in (plan, *(f.plan for f in plan.fallbacks))]


def test_shrinking_free_memory_switches_to_the_fallback_that_fits(model_and_plan, caplog) -> None:  # noqa: ANN001
    module, inputs, plan = model_and_plan
    need = needs(plan)
    placements = [p.placement for p in (plan, *(f.plan for f in plan.fallbacks))]
    assert placements[0] != placements[2]  # the fallbacks really place ops elsewhere
    free = {"cuda:0": need[0]}
    live = emit_live(plan, module, BIND, probe=lambda: dict(free))
    with torch.no_grad():
        expected = module(*inputs)
    seen = []
    caplog.set_level(logging.WARNING, logger="backends.torch.live")
    for level in (need[0], need[0], need[1] + 10, need[1], need[2], need[2], need[0] + 1):
        free["cuda:0"] = level
        with torch.no_grad():
            out = live(*inputs)
        torch.testing.assert_close(out, expected)  # every plan computes the model
        seen.append(live.labels[live.active])
    assert seen == ["primary", "primary", "fallback 0.6", "fallback 0.6", "fallback 0.3", "fallback 0.3", "primary"]
    switches = [r.getMessage() for r in caplog.records if "switching" in r.getMessage()]
    assert live.switches == len(switches) == 3  # once per switch, not once per call
    assert "from the primary plan to the fallback 0.6 plan" in switches[0]
    assert f"fallback 0.6 needs {format_bytes(need[1])}" in switches[0]
    ops_on_gpu = {op for op, d in plan.fallbacks[1].plan.placement.items() if d == "cuda:0"}
    assert live.plans[live.active] is plan and len(ops_on_gpu) < len(plan.placement)


def test_no_plan_fitting_fails_before_any_op_runs(model_and_plan) -> None:  # noqa: ANN001
    module, inputs, plan = model_and_plan
    least = needs(plan)[-1]
    live = emit_live(plan, module, BIND, probe=lambda: {"cuda:0": least - 1})
    counter = OpCounter()
    with counter, pytest.raises(NoPlanFits) as exc:
        live(*inputs)
    assert counter.ops == []  # nothing dispatched: the check ran before any work
    assert live.active is None and live.placed is None
    message = str(exc.value)
    assert f"cuda:0: {format_bytes(least - 1)} available, the plans need at least {format_bytes(least)}" in message
    assert "nothing was run" in message
    live.probe = lambda: {"cuda:0": least}  # the control: the counter does see the ops of a call that runs
    with counter:
        live(*inputs)
    assert any("addmm" in op or "mm" in op for op in counter.ops)


def test_the_probe_can_be_replaced_and_weights_carry_over(model_and_plan) -> None:  # noqa: ANN001
    module, inputs, plan = model_and_plan
    need = needs(plan)
    live = emit_live(plan, module, BIND)  # the default probe: cuda:0 is bound to the CPU, so not limited
    with torch.no_grad():
        live(*inputs)
    assert live.labels[live.active] == "primary"
    with torch.no_grad():  # a change to the running plan's weights survives a switch
        for p in live.placed.parameters():
            p.mul_(0.5)
        halved = live(*inputs)
    live.probe = lambda: {"cuda:0": need[2]}
    with torch.no_grad():
        out = live(*inputs)
    assert live.labels[live.active] == "fallback 0.3"
    torch.testing.assert_close(out, halved)


def test_a_probe_answering_nonsense_is_named(model_and_plan) -> None:  # noqa: ANN001
    module, inputs, plan = model_and_plan
    live = LiveModule(plan, module, BIND, probe=lambda: 123)
    with pytest.raises(HetpartError, match="the memory probe returned int"):
        live(*inputs)
    live.probe = lambda: {"cuda:3": 1}
    with pytest.raises(HetpartError, match="cuda:3, not devices of the plan"):
        live(*inputs)


def test_a_training_plan_is_refused() -> None:
    module, inputs = models.get("mlp", "tiny")
    plan = partition(module, inputs, "h200-host", training=True, fallbacks=[0.5], time_limit=20)
    assert len(plan.fallbacks) == 1 and plan.fallbacks[0].plan.training
    with pytest.raises(HetpartError, match="training step"):
        emit_live(plan, module, BIND)
